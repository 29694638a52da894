"""Count the Spanner API calls a process makes, at the gRPC client.

``counting()`` wraps the channel of every google-cloud-spanner ``Database`` (each Django
connection has its own) in a gRPC interceptor for as long as the context is open, so calls of
every thread are counted: unary calls (``ExecuteSql``, ``Commit``, ``BeginTransaction``...) and
streaming calls (``ExecuteStreamingSql``, ``BatchWrite``) alike, one per call whatever it
carries. Used by the round-trip tests and ``benchmarks/native_round_trips.py``; it works on the
emulator, the front and a real instance.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc


class CallCounter(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Spanner API calls by method name (``"Commit"``...), counted as they start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._statements: Counter[str] = Counter()

    def _count(self, method: str, request: Any) -> None:
        sql = getattr(request, "sql", None)
        with self._lock:
            self._calls[method.rsplit("/", 1)[-1]] += 1
            if isinstance(sql, str) and sql:
                self._statements[_statement_kind(sql)] += 1

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self._count(details.method, request)
        return continuation(details, request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        self._count(details.method, request)
        return continuation(details, request)

    def statements(self) -> Counter[str]:
        """The SQL calls by kind (``_statement_kind``): which statements the calls were."""
        with self._lock:
            return Counter(self._statements)

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self._calls)

    def reset(self) -> None:
        with self._lock:
            self._calls.clear()

    #: session management, not a round trip of the work (the client pools sessions).
    SESSION_CALLS = frozenset({"CreateSession", "BatchCreateSessions", "GetSession"})

    def work_calls(self) -> Counter[str]:
        """The calls other than session management."""
        return Counter({k: v for k, v in self.snapshot().items() if k not in self.SESSION_CALLS})

    def total(self) -> int:
        return sum(self.work_calls().values())


def _statement_kind(sql: str) -> str:
    """A statement's verb and the table, queue or function it names ("DELETE FROM x",
    "SELECT ... RECEIVE_x"), without its values."""
    words = sql.split()
    verb = words[0].upper() if words else ""
    for marker in ("RECEIVE_", "RENEWLEASE_"):
        at = sql.find(marker)
        if at >= 0:
            return f"{verb} {sql[at:].split('(')[0]}"
    for keyword in ("FROM", "INTO", "UPDATE"):
        upper = [w.upper() for w in words]
        if keyword in upper:
            index = upper.index(keyword)
            if index + 1 < len(words):
                return f"{verb} {keyword} {words[index + 1]}"
    return verb


@contextlib.contextmanager
def counting() -> Iterator[CallCounter]:
    """Count every Spanner API call of this process while the context is open."""
    from google.cloud.spanner_v1.database import Database
    from google.cloud.spanner_v1.services.spanner import SpannerClient
    from google.cloud.spanner_v1.services.spanner.transports.grpc import SpannerGrpcTransport

    counter = CallCounter()
    original = Database.spanner_api
    wrapped: dict[int, Any] = {}  # id(original client) -> counted client
    touched: list[tuple[Any, Any]] = []  # (Database, its own client)

    def counted(self: Any) -> Any:
        api = original.fget(self)
        if getattr(api, "_sq_counter", None) is counter:
            return api
        inner = getattr(api, "_sq_inner", api)
        client = wrapped.get(id(inner))
        if client is None:
            channel = grpc.intercept_channel(inner.transport.grpc_channel, counter)
            client = SpannerClient(
                transport=SpannerGrpcTransport(channel=channel),
                client_info=self._instance._client._client_info,
            )
            client._sq_counter = counter  # type: ignore[attr-defined]
            client._sq_inner = inner  # type: ignore[attr-defined]
            wrapped[id(inner)] = client
        touched.append((self, inner))
        self._spanner_api = client
        return client

    Database.spanner_api = property(counted)  # type: ignore[method-assign,assignment]
    try:
        yield counter
    finally:
        Database.spanner_api = original  # type: ignore[method-assign]
        for database, inner in touched:
            database._spanner_api = inner

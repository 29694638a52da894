"""Injected faults and a record of requests: make the front fail chosen calls with a chosen
status, and see what clients sent, for tests of how a client copes with Spanner's errors.

The front answers a small control API of its own on the service of ``Describe``
(``/spanner_queues.emulator.Front/``), JSON in and out, which ``FrontControl`` wraps::

    control = FrontControl("127.0.0.1:9010")
    control.fail("Commit", "ABORTED", "Transaction was aborted")       # the next Commit
    control.fail("ExecuteStreamingSql", "UNAVAILABLE", sql_contains="RECEIVE_", times=2)
    control.fail("Commit", "UNAVAILABLE", "connection reset", after=True)  # applied, answer lost

Guarantees:

- A fault answers the next ``times`` calls of ``method`` (the Spanner API method's short name:
  ``Commit``, ``ExecuteSql``, ``ExecuteStreamingSql``, ``ExecuteBatchDml``, ``BeginTransaction``,
  ``Rollback``, ``BatchWrite``, ``CreateSession``...) whose SQL contains ``sql_contains`` (for
  ``ExecuteBatchDml``: any of its statements; a method without SQL never matches a
  ``sql_contains``) with status ``code`` and ``message``, before the call reaches the emulator:
  nothing of it applies. A failed ``Commit`` of a read-write transaction rolls that transaction
  back, as Spanner drops it.
- With ``after``, the call runs first, its effects applied, and then ends with the fault's status
  instead of its answer (a streaming call: after its last message): a commit applied while its
  answer is lost.
- Faults are taken in the order they were added, each by one call at a time; ``clear()`` drops
  the pending ones and the record.
- ``script(sql_contains, rows)`` answers the next query whose SQL contains the text with
  ``rows`` (wire values: strings, numbers, booleans, None) instead of running it, or with
  ``error=(code, message)``; a scripted ``RECEIVE_<Q>``/``RENEWLEASE_<Q>`` gets the columns and
  types that call selects, any other query STRING columns ``c0``, ``c1``... Nothing is leased
  or renewed. ``configure(resume_tokens=False)`` makes ``RECEIVE`` batches carry no resume
  token (Spanner does not document whether they do); ``configure(short_receive=...)`` chooses
  how a very short ``RECEIVE`` is answered (``receiving.SHORT_RECEIVE_MODES``: ``generous``,
  ``empty``, ``refuse``); ``configure(backoff=..., retry_info=...)`` choose the other open
  answers (``answers``); ``configure(deliver_time=...)`` what a lease does to a message's
  ``DeliverTime`` (``queues.DELIVER_TIME_MODES``: ``kept``, ``lease_expiry``, ``next_due``);
  ``clear()`` undoes scripts and settings (back to the mode the front was started with).
- While recording (``record(True)``), every call but the control API's own is kept, in arrival
  order, as (method, serialized request); ``requests()`` returns them parsed into
  google-cloud-spanner's request types. ``end_streams()`` ends every open ``RECEIVE`` stream as
  its ``max_duration`` would; ``receive_ends()`` says how each recorded ``RECEIVE`` call ended
  (``"ended"``: its duration or ``end_streams``; ``"cancelled"``: by the client).

The control API is as unauthenticated as the rest of the front: keep it on loopback.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import grpc
from google.protobuf import struct_pb2

from spanner_queues_emulator import answers
from spanner_queues_emulator import backend as b
from spanner_queues_emulator.queues import DELIVER_TIME_MODES
from spanner_queues_emulator.receiving import SHORT_RECEIVE_MODES

SERVICE = "/spanner_queues.emulator.Front/"
#: the control methods, by name (``SERVICE + name``).
CONTROL = (
    "Fail",
    "Script",
    "Configure",
    "Clear",
    "Record",
    "Requests",
    "EndStreams",
    "ReceiveEnds",
)


@dataclass(frozen=True)
class Fault:
    """One injected fault (see the module's docstring)."""

    method: str
    code: str
    message: str = "injected"
    sql_contains: str | None = None
    times: int = 1
    after: bool = False

    def __post_init__(self) -> None:
        if self.code not in grpc.StatusCode.__members__ or self.code == "OK":
            raise ValueError(f"code must name a gRPC status other than OK, not {self.code!r}")
        if self.times < 1:
            raise ValueError(f"times must be >= 1, not {self.times!r}")
        if not self.method or "/" in self.method:
            raise ValueError(f"method is a short name like 'Commit', not {self.method!r}")

    @property
    def status(self) -> grpc.StatusCode:
        return grpc.StatusCode[self.code]


@dataclass(frozen=True)
class Scripted:
    """The answer to the next query containing ``sql_contains``: ``rows`` or ``error``."""

    sql_contains: str
    rows: list[list[Any]]
    error: Fault | None = None


def wire_value(item: Any) -> Any:
    """A wire value (``struct_pb2.Value``) of a JSON value."""
    if item is None:
        return b.Value(null_value=struct_pb2.NULL_VALUE)
    if isinstance(item, bool):
        return b.Value(bool_value=item)
    if isinstance(item, (int, float)):
        return b.Value(number_value=item)
    if isinstance(item, list):
        return b.Value(list_value=b.ListValue(values=[wire_value(v) for v in item]))
    return b.Value(string_value=str(item))


def request_sql(method: str, request: bytes) -> list[str]:
    """The SQL a request carries (``ExecuteBatchDml``: each statement's); none for others."""
    if method in ("ExecuteSql", "ExecuteStreamingSql"):
        return [b.ExecuteSqlRequest.FromString(request).sql]
    if method == "ExecuteBatchDml":
        return [s.sql for s in b.ExecuteBatchDmlRequest.FromString(request).statements]
    return []


class Faults:
    """The pending faults and the record of one front; thread-safe."""

    def __init__(
        self,
        short_receive: str = "generous",
        *,
        backoff: str = "exponential",
        retry_info: str = "always",
        deliver_time: str = "kept",
    ) -> None:
        self._lock = threading.Lock()
        self._pending: list[list[Any]] = []  # [fault, calls left]
        self._recording = False
        self._record: list[tuple[str, bytes]] = []
        self._receive_ends: list[str] = []
        self._epoch = 0  # the record's generation: each clear starts a new one
        self._scripts: list[Scripted] = []
        #: whether RECEIVE batches carry resume tokens (``configure``).
        self.resume_tokens = True
        #: how a short RECEIVE is answered (``configure``; ``receiving.SHORT_RECEIVE_MODES``),
        #: and the front's own choice, which ``clear`` restores
        self.short_receive = self._short_receive_default = short_receive
        #: the ``answers`` modes (``configure``), and the front's own, which ``clear`` restores
        self.backoff = self._backoff_default = backoff
        self.retry_info = self._retry_info_default = retry_info
        #: what a lease does to ``DeliverTime`` (``configure``; ``queues.DELIVER_TIME_MODES``),
        #: and the front's own choice, which ``clear`` restores
        self.deliver_time = self._deliver_time_default = deliver_time

    def add_script(self, script: Scripted) -> None:
        with self._lock:
            self._scripts.append(script)

    def scripted(self, sql: str) -> Scripted | None:
        """The script answering the query ``sql``, taken (each answers one query)."""
        with self._lock:
            for script in self._scripts:
                if script.sql_contains in sql:
                    self._scripts.remove(script)
                    return script
        return None

    def add(self, fault: Fault) -> None:
        with self._lock:
            self._pending.append([fault, fault.times])

    def clear(self) -> None:
        with self._lock:
            self._pending.clear()
            self._record.clear()
            self._receive_ends.clear()
            self._epoch += 1
            self._scripts.clear()
            self.resume_tokens = True
            self.short_receive = self._short_receive_default
            self.backoff = self._backoff_default
            self.retry_info = self._retry_info_default
            self.deliver_time = self._deliver_time_default

    def set_recording(self, on: bool) -> None:
        with self._lock:
            self._recording = on
            self._record.clear()
            self._receive_ends.clear()
            self._epoch += 1

    def arrived(self, method: str, request: bytes) -> Fault | None:
        """Record the call (when recording); the fault it takes, if one matches."""
        with self._lock:
            if self._recording:
                self._record.append((method, request))
            candidates = [p for p in self._pending if p[0].method == method]
            if not candidates:
                return None
        sql = request_sql(method, request) if any(p[0].sql_contains for p in candidates) else []
        with self._lock:
            for item in self._pending:
                fault = item[0]
                if fault.method != method:
                    continue
                if fault.sql_contains is not None and not any(fault.sql_contains in s for s in sql):
                    continue
                item[1] -= 1
                if item[1] <= 0:
                    self._pending.remove(item)
                return fault
        return None

    def receive_started(self) -> Callable[[str], None]:
        """A RECEIVE call starts: the callback it calls when it ends (``"ended"`` or
        ``"cancelled"``); a call that started before the record was last cleared is not
        counted."""
        with self._lock:
            epoch = self._epoch

        def ended(how: str) -> None:
            with self._lock:
                if self._recording and epoch == self._epoch:
                    self._receive_ends.append(how)

        return ended

    def recorded(self) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self._record)

    def receive_ends(self) -> list[str]:
        with self._lock:
            return list(self._receive_ends)

    def control(self, name: str, body: dict[str, Any], end_streams: Callable[[], None]) -> Any:
        """Answer the control method ``name`` (JSON ``body``); ``ValueError`` on a bad one."""
        if name == "Fail":
            self.add(Fault(**body))
            return {}
        if name == "Script":
            error = body.get("error")
            self.add_script(
                Scripted(
                    body["sql_contains"],
                    list(body.get("rows") or []),
                    Fault("Script", error[0], error[1]) if error else None,
                )
            )
            return {}
        if name == "Configure":
            if "resume_tokens" in body:
                self.resume_tokens = bool(body["resume_tokens"])
            if "short_receive" in body:
                if body["short_receive"] not in SHORT_RECEIVE_MODES:
                    raise ValueError(
                        f"short_receive must be one of {', '.join(SHORT_RECEIVE_MODES)}, "
                        f"not {body['short_receive']!r}"
                    )
                self.short_receive = body["short_receive"]
            if "backoff" in body:
                self.backoff = answers.backoff_mode(body["backoff"])
            if "retry_info" in body:
                self.retry_info = answers.retry_info_mode(body["retry_info"])
            if "deliver_time" in body:
                if body["deliver_time"] not in DELIVER_TIME_MODES:
                    raise ValueError(
                        f"deliver_time must be one of {', '.join(DELIVER_TIME_MODES)}, "
                        f"not {body['deliver_time']!r}"
                    )
                self.deliver_time = body["deliver_time"]
            return {}
        if name == "Clear":
            self.clear()
            return {}
        if name == "Record":
            self.set_recording(bool(body.get("on", True)))
            return {}
        if name == "Requests":
            return [
                {"method": m, "request": base64.b64encode(r).decode()} for m, r in self.recorded()
            ]
        if name == "EndStreams":
            end_streams()
            return {}
        if name == "ReceiveEnds":
            return self.receive_ends()
        raise ValueError(f"no control method {name!r}")


# --- the client side -----------------------------------------------------------------------
_REQUEST_TYPES: dict[str, Any] = {}


def _request_type(method: str) -> Any:
    if not _REQUEST_TYPES:
        from google.cloud.spanner_admin_database_v1.types import spanner_database_admin as admin
        from google.cloud.spanner_v1.types import spanner

        _REQUEST_TYPES.update(
            {
                "UpdateDatabaseDdl": admin.UpdateDatabaseDdlRequest,
                "CreateDatabase": admin.CreateDatabaseRequest,
                "ExecuteSql": spanner.ExecuteSqlRequest,
                "ExecuteStreamingSql": spanner.ExecuteSqlRequest,
                "ExecuteBatchDml": spanner.ExecuteBatchDmlRequest,
                "Commit": spanner.CommitRequest,
                "Rollback": spanner.RollbackRequest,
                "BeginTransaction": spanner.BeginTransactionRequest,
                "BatchWrite": spanner.BatchWriteRequest,
                "CreateSession": spanner.CreateSessionRequest,
                "BatchCreateSessions": spanner.BatchCreateSessionsRequest,
                "DeleteSession": spanner.DeleteSessionRequest,
                "StreamingRead": spanner.ReadRequest,
                "Read": spanner.ReadRequest,
            }
        )
    return _REQUEST_TYPES.get(method)


@dataclass
class Recorded:
    """A recorded call: its method's short name and its request (google-cloud-spanner's
    proto-plus type for the Spanner API's methods, else the serialized bytes)."""

    method: str
    request: Any

    @property
    def sql(self) -> str | None:
        return getattr(self.request, "sql", None) if not isinstance(self.request, bytes) else None


class FrontControl:
    """The control API of the front at ``host`` (``HOST:PORT``, as ``SPANNER_EMULATOR_HOST``)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._channel = grpc.insecure_channel(host)

    def close(self) -> None:
        self._channel.close()

    def _call(self, name: str, body: dict[str, Any] | None = None) -> Any:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(SERVICE + name)
        return json.loads(call(json.dumps(body or {}).encode(), timeout=30) or b"null")

    def fail(
        self,
        method: str,
        code: grpc.StatusCode | str,
        message: str = "injected",
        *,
        sql_contains: str | None = None,
        times: int = 1,
        after: bool = False,
    ) -> None:
        """Answer the next ``times`` calls of ``method`` (matching ``sql_contains``) with
        ``code``; with ``after``, once the call has run and applied its effects."""
        name = code.name if isinstance(code, grpc.StatusCode) else code
        fault = Fault(method, name, message, sql_contains, times, after)  # checked here too
        self._call("Fail", asdict(fault))

    def script(
        self,
        sql_contains: str,
        rows: list[list[Any]] | None = None,
        *,
        error: tuple[grpc.StatusCode | str, str] | None = None,
    ) -> None:
        """Answer the next query containing ``sql_contains`` with ``rows`` (wire values) or
        ``error`` instead of running it."""
        wire_error = None
        if error is not None:
            code = error[0].name if isinstance(error[0], grpc.StatusCode) else error[0]
            Fault("Script", code, error[1])  # checked here too
            wire_error = [code, error[1]]
        self._call("Script", {"sql_contains": sql_contains, "rows": rows, "error": wire_error})

    def configure(
        self,
        *,
        resume_tokens: bool = True,
        short_receive: str | None = None,
        backoff: str | None = None,
        retry_info: str | None = None,
        deliver_time: str | None = None,
    ) -> None:
        """Settings of the front's answers (until ``clear()``): resume tokens on RECEIVE
        batches; how a very short RECEIVE is answered (``generous``, ``empty``, ``refuse``);
        the back-off after an unread lease (``exponential``, ``none``, ``slow``); whether an
        ABORTED carries a RetryInfo (``always``, ``never``); what a lease does to
        ``DeliverTime`` (``kept``, ``lease_expiry``, ``next_due``); None: as it is."""
        body: dict[str, Any] = {"resume_tokens": resume_tokens}
        if short_receive is not None:
            body["short_receive"] = short_receive
        if backoff is not None:
            body["backoff"] = answers.backoff_mode(backoff)  # checked here too
        if retry_info is not None:
            body["retry_info"] = answers.retry_info_mode(retry_info)
        if deliver_time is not None:
            body["deliver_time"] = deliver_time
        self._call("Configure", body)

    def clear(self) -> None:
        """Drop pending faults, scripts, settings and the record."""
        self._call("Clear")

    def record(self, on: bool = True) -> None:
        """Start (or stop) recording requests; either way the record starts empty."""
        self._call("Record", {"on": on})

    def requests(self) -> list[Recorded]:
        """The recorded calls, in arrival order."""
        out = []
        for item in self._call("Requests"):
            raw = base64.b64decode(item["request"])
            kind = _request_type(item["method"])
            out.append(Recorded(item["method"], kind.deserialize(raw) if kind else raw))
        return out

    def sql(self, contains: str = "") -> list[Recorded]:
        """The recorded calls with SQL containing ``contains``."""
        return [r for r in self.requests() if r.sql is not None and contains in r.sql]

    def commits(self) -> list[Any]:
        """The recorded ``CommitRequest``s."""
        return [r.request for r in self.requests() if r.method == "Commit"]

    def end_streams(self) -> None:
        """End every open RECEIVE stream now, as its ``max_duration`` would."""
        self._call("EndStreams")

    def receive_ends(self) -> list[str]:
        """How each recorded RECEIVE call ended: ``"ended"`` or ``"cancelled"``."""
        return list(self._call("ReceiveEnds"))

"""The native engine on the wire: values as the google-cloud-spanner client writes and reads
them (keys, payloads), and the calls that bypass the Django cursor: the ``Database`` of an
alias, ``RENEWLEASE_<Q>`` on a strong single-use snapshot (chunked), ``RECEIVE_<Q>``'s raw
streaming call, the ``Send``/``Ack`` mutations in a read-write transaction (safe to retry), and
whether an emulator has queues.

Deadlines: queries made here (``query``: the stats, ``RENEWLEASE``) are one unary
``ExecuteSql`` each, with a deadline (``CALL_DEADLINE_SECONDS``) and a bounded retry with
back-off on UNAVAILABLE and RESOURCE_EXHAUSTED (``bounded_retry``), but ``RENEWLEASE``, which
is not idempotent (each call rotates the token: a repeat of a call that applied finds its
token rotated out), and is sent once (``renew``: ``RenewalOutcomeUnknown``). They never go through
``Snapshot.execute_sql``, whose ``_restart_on_unavailable`` retries UNAVAILABLE at once and
without end: with Spanner unreachable a thread spun there at 100 % CPU and a stop never
completed. ``RECEIVE_<Q>`` has its own deadline and restarts (``receive_stream``)."""

from __future__ import annotations

import base64
import functools
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import grpc
from django.db import connections
from google.api_core import exceptions as gexc
from google.api_core import retry as retries
from google.api_core.grpc_helpers import _StreamingResponseIterator
from google.cloud.spanner_v1 import (
    ExecuteSqlRequest,
    RequestOptions,
    TransactionSelector,
    param_types,
)
from google.cloud.spanner_v1._helpers import (
    _make_value_pb,
    _merge_query_options,
    _metadata_with_prefix,
    _parse_list_value_pbs,
)
from google.cloud.spanner_v1.streamed import StreamedResultSet
from google.cloud.spanner_v1.types import TransactionOptions
from google.protobuf.struct_pb2 import Struct

from spanner_queues.drivers import grpc_status
from spanner_queues.engines.spanner_ddl import MAX_QUERY_PARAMETERS
from spanner_queues.exceptions import CommitOutcomeUnknown
from spanner_queues.keys import key_fields
from spanner_queues.payload import BYTES, JSON, from_stored, json_value_text, stored_text

if TYPE_CHECKING:
    from spanner_queues.models import Queue


def database_for(alias: str) -> Any:
    """The ``google.cloud.spanner_v1.Database`` behind Django database ``alias``."""
    wrapper = connections[alias]
    wrapper.ensure_connection()
    return wrapper.connection.database


@functools.lru_cache(maxsize=8)
def emulator_has_queues(host: str) -> bool:
    """Ask the emulator at ``host`` whether it has queues: the queue-aware front answers its
    ``Describe`` call, Google's plain emulator answers UNIMPLEMENTED."""
    channel = grpc.insecure_channel(host)
    try:
        describe: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/spanner_queues.emulator.Front/Describe"
        )
        reply = describe(b"", timeout=5)
        return json.loads(reply).get("queues") is True
    except (grpc.RpcError, ValueError):
        return False
    finally:
        channel.close()


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """``items`` in consecutive slices of at most ``size`` (at least one item each): Spanner
    refuses a statement of more than ``MAX_QUERY_PARAMETERS`` parameters."""
    size = max(1, size)
    return [items[i : i + size] for i in range(0, len(items), size)]


def prep_key(model: type[Queue], key: Sequence[Any], connection: Any) -> list[Any]:
    """Key values as the ORM writes and filters them (``UUIDField`` -> 32-char hex,
    ``BinaryField`` -> base64 for the client): the same values for DML and mutations."""
    return [
        f.get_db_prep_value(v, connection, prepared=False)
        for f, v in zip(key_fields(model), key, strict=True)
    ]


def key_from_row(model: type[Queue], values: Sequence[Any]) -> tuple[Any, ...]:
    """RECEIVE key columns back to Python values, as the ORM reads them."""
    out = []
    for f, v in zip(key_fields(model), values, strict=True):
        if v is not None and f.get_internal_type() == "BinaryField":
            v = decode_bytes(v)
        elif v is not None:
            v = f.to_python(v)
        out.append(v)
    return tuple(out)


def decode_bytes(value: Any) -> bytes:
    """BYTES values come back from the Python client as base64 text."""
    if value is None:
        return b""
    return base64.b64decode(value)


def wire_payload(payload_type: str, payload: bytes) -> bytes | str:
    """An encoded payload as the client sends it: BYTES base64-encoded, STRING and JSON as
    text (never base64)."""
    return base64.b64encode(payload) if payload_type == BYTES else stored_text(payload)


def payload_from_wire(payload_type: str, value: Any) -> bytes:
    """``Message.payload`` for a ``Payload`` value read back: BYTES base64-decoded, STRING as
    UTF-8, JSON (a ``JsonObject``) as canonical JSON text."""
    if payload_type == BYTES:
        return decode_bytes(value)
    if payload_type == JSON:
        return json_value_text(value)
    return from_stored(value)


#: seconds one query made here may take, retries included (``query``)
CALL_DEADLINE_SECONDS = 10.0

#: counted once per failed attempt of a ``query`` that is retried (tests and benchmarks read it:
#: with Spanner unreachable a query makes a handful of attempts, not a spin)
retried_attempts = 0


def bounded_retry(deadline: float) -> Any:
    """Retry UNAVAILABLE and RESOURCE_EXHAUSTED with exponential back-off (0.1 s doubling to
    2 s) for at most ``deadline`` seconds in all."""

    def counted(_exc: BaseException) -> None:
        global retried_attempts
        retried_attempts += 1

    return retries.Retry(
        predicate=retries.if_exception_type(gexc.ServiceUnavailable, gexc.ResourceExhausted),
        initial=0.1,
        maximum=2.0,
        multiplier=2.0,
        timeout=deadline,
        on_error=counted,
    )


def query(
    database: Any,
    sql: str,
    params: Mapping[str, Any] | None = None,
    param_types: Mapping[str, Any] | None = None,
    *,
    deadline: float = CALL_DEADLINE_SECONDS,
    idempotent: bool = True,
) -> list[list[Any]]:
    """The rows of ``sql`` read in a strong single-use read-only transaction: one unary
    ``ExecuteSql`` with a deadline of ``deadline`` seconds, retries included
    (``bounded_retry``; not ``idempotent``: sent once, no retry); past it, the last error is
    raised (``RetryError``, ``DeadlineExceeded``...). For small results (one call, no
    resume)."""

    request = ExecuteSqlRequest(
        sql=sql,
        params=Struct(fields={k: _make_value_pb(v) for k, v in (params or {}).items()}),
        param_types=dict(param_types or {}),
        transaction=TransactionSelector(
            single_use=TransactionOptions(read_only=TransactionOptions.ReadOnly(strong=True))
        ),
        query_options=_merge_query_options(database._instance._client._query_options, None),
        request_options=RequestOptions(),
    )
    with database.snapshot() as snapshot:  # a session, as the client picks one
        request.session = snapshot._session.name
        result = database.spanner_api.execute_sql(
            request=request,
            metadata=_metadata_with_prefix(database.name),
            retry=bounded_retry(deadline) if idempotent else None,
            timeout=deadline,
        )
    return _parse_list_value_pbs(result._pb.rows, result.metadata.row_type)


#: seconds a streaming read (``Snapshot.execute_sql``: the Django cursor's queries) may go on
#: retrying UNAVAILABLE before it fails (``bound_streaming_reads``)
STREAM_RETRY_DEADLINE_SECONDS = 30.0

#: seconds one ``Commit`` may take, its retries of UNAVAILABLE and RESOURCE_EXHAUSTED included
#: (``bound_streaming_reads``; the client's default is 3,600): past it the commit's outcome is
#: unknown (``CommitOutcomeUnknown`` from the engine's mutations; the database error from the
#: Django cursor's commit). Read when each commit is made.
COMMIT_DEADLINE_SECONDS = 30.0


class _TrackedCall:
    """A streaming call whose UNAVAILABLE is recorded for the retry that follows."""

    def __init__(self, owner: _BoundedStreamingReads, request: Any, call: Any) -> None:
        self._owner = owner
        self._request = request
        self._call = call

    def __iter__(self) -> Iterator[Any]:

        try:
            for item in self._call:
                self._owner._succeeded(self._request)
                yield item
        except gexc.ServiceUnavailable:
            self._owner._failed(self._request)
            raise

    def __getattr__(self, name: str) -> Any:  # cancel(), ...
        return getattr(self._call, name)


class _BoundedStreamingReads:
    """A ``Database.spanner_api`` whose ``execute_streaming_sql`` the client may call again
    after UNAVAILABLE only after a back-off (0.1 s doubling to 2 s) and for at most
    ``deadline`` seconds in all: the client's ``_restart_on_unavailable`` calls it again at
    once, with the same request, for ever (a thread at 100 % CPU, a stop that never
    completes). Past the deadline the repeat raises ``DeadlineExceeded``, which that loop does
    not catch. ``commit`` gets a deadline of ``COMMIT_DEADLINE_SECONDS`` (retries included)
    instead of the client's hour. Everything else is the client's own API."""

    def __init__(self, api: Any, deadline: float) -> None:
        self._api = api
        self._deadline = deadline
        self._lock = threading.Lock()
        #: id(request) -> (failures in a row, monotonic time of the first, the request)
        self._failing: dict[int, tuple[int, float, Any]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        deadline = COMMIT_DEADLINE_SECONDS
        kwargs.setdefault("retry", bounded_retry(deadline))
        kwargs.setdefault("timeout", deadline)
        return self._api.commit(*args, **kwargs)

    def execute_streaming_sql(self, request: Any = None, **kwargs: Any) -> Any:

        now = time.monotonic()
        with self._lock:
            for key, (_, since, _) in list(self._failing.items()):  # abandoned ones
                if now - since > 2 * self._deadline:
                    del self._failing[key]
            state = self._failing.get(id(request))
        if state is not None and state[2] is request:
            failures, since, _ = state
            if now - since >= self._deadline:
                self._succeeded(request)
                raise gexc.DeadlineExceeded(
                    f"Spanner answered UNAVAILABLE for {self._deadline:.0f} s; not retried further"
                )
            time.sleep(min(2.0, 0.1 * 2 ** (failures - 1)))
        try:  # (the API's stream wrapper reads the first response here)
            call = self._api.execute_streaming_sql(request=request, **kwargs)
        except gexc.ServiceUnavailable:
            self._failed(request)
            raise
        return _TrackedCall(self, request, call)

    def _failed(self, request: Any) -> None:
        with self._lock:
            failures, since, _ = self._failing.get(id(request), (0, time.monotonic(), request))
            self._failing[id(request)] = (failures + 1, since, request)

    def _succeeded(self, request: Any) -> None:
        if self._failing:
            with self._lock:
                self._failing.pop(id(request), None)


#: seconds the DB-API waits before it replays an aborted transaction whose ABORTED carries no
#: ``RetryInfo`` (``bound_aborted_replays``). Cloud Spanner's carry one, Google does not say
#: every one does, and Google's emulator sends none; the DB-API's own default is
#: ``2**attempt`` seconds (2, 4, 8...: minutes for a transaction aborted a few times in a row,
#: during which a worker does not see SIGTERM).
ABORTED_REPLAY_DELAY_SECONDS = 0.1


def bound_aborted_replays(
    dbapi_connection: Any, delay: float = ABORTED_REPLAY_DELAY_SECONDS
) -> None:
    """Have ``dbapi_connection`` (django_spanner's DB-API connection) wait ``delay`` seconds
    before each replay of an aborted transaction whose ABORTED carries no ``RetryInfo``; one
    that carries one is still waited as it says; the rollback Django makes after a replay
    that failed warns nothing. Idempotent; a connection without the DB-API's retry helper is
    left as it is."""
    helper = getattr(dbapi_connection, "_transaction_helper", None)
    if helper is None or getattr(helper, "_spanner_queues_bounded", False):
        return
    # A replay that fails (RetryAborted) ends the transaction in the driver; Django's atomic
    # then rolls back, and the driver warned "This method is non-operational..." (a bare
    # UserWarning in the native demo): the error itself reaches the caller.
    variables = getattr(dbapi_connection, "_connection_variables", None)
    if isinstance(variables, dict):
        variables["ignore_transaction_warnings"] = True
    original = helper.retry_transaction

    def retry_transaction(default_retry_delay: float | None = None) -> Any:
        return original(
            default_retry_delay=delay if default_retry_delay is None else default_retry_delay
        )

    helper.retry_transaction = retry_transaction
    helper._spanner_queues_bounded = True


def bound_streaming_reads(database: Any, deadline: float = STREAM_RETRY_DEADLINE_SECONDS) -> Any:
    """Give ``database`` (a ``Database``, e.g. a Django connection's) streaming reads that
    retry UNAVAILABLE with back-off for at most ``deadline`` seconds, and commits that give up
    after ``COMMIT_DEADLINE_SECONDS`` (``_BoundedStreamingReads``); idempotent. Returns
    ``database``."""
    api = database.spanner_api
    if not isinstance(api, _BoundedStreamingReads):
        database._spanner_api = _BoundedStreamingReads(api, deadline)
    return database


class RenewalOutcomeUnknown(Exception):
    """A ``RENEWLEASE_<Q>`` call was sent and its answer lost (``UNKNOWN_OUTCOME``): it may
    have renewed the leases under new tokens nobody holds, so its tokens must not be sent
    again (``tokens``). ``renewed``: the answers of the other calls of the same renewal."""

    def __init__(
        self,
        tokens: Sequence[str],
        cause: BaseException,
        renewed: Mapping[str, tuple[str | None, Any]] | None = None,
    ) -> None:
        super().__init__(f"RENEWLEASE of {len(tokens)} token(s) sent, its answer lost: {cause}")
        self.tokens = list(tokens)
        self.renewed = dict(renewed or {})


def stop_sessions_on_close(dbapi_connection: Any) -> None:
    """Have ``dbapi_connection`` (django_spanner's DB-API connection) stop its ``Database``'s
    session maintenance when it is closed: google-cloud-spanner starts one
    ``maintenance-multiplexed-session`` thread per ``Database`` (one per Django connection),
    which ``Connection.close()`` never stops and which holds its client for good. Once told
    (its terminate event), the thread exits at its next wake-up, within ten minutes (it sleeps
    uninterruptibly). Idempotent."""
    if getattr(dbapi_connection, "_spanner_queues_stops_sessions", False):
        return
    close = dbapi_connection.close

    def close_and_stop() -> None:
        try:
            close()
        finally:
            manager = getattr(dbapi_connection.database, "_sessions_manager", None)
            event = getattr(manager, "_multiplexed_session_terminate_event", None)
            if event is not None:
                event.set()

    dbapi_connection.close = close_and_stop
    dbapi_connection._spanner_queues_stops_sessions = True


def renew(database: Any, sql: str, params: Mapping[str, str]) -> dict[str, tuple[str | None, Any]]:
    """Run ``RENEWLEASE_<Q>`` once, each lease token a STRING parameter of ``sql``'s array
    literal: old token -> (new token, new expiry). One call with a deadline (``query``), never
    retried: a repeat would find the tokens the first call rotated out and answer them lost.
    ``RenewalOutcomeUnknown`` when its answer was lost (``UNKNOWN_OUTCOME``)."""
    try:
        rows = query(
            database,
            sql,
            params=dict(params),
            param_types={name: param_types.STRING for name in params},
            idempotent=False,
        )
    except Exception as exc:
        if grpc_status(exc) in UNKNOWN_OUTCOME:
            raise RenewalOutcomeUnknown(list(params.values()), exc) from exc
        raise
    return {old: (new, expires) for old, new, expires in rows}


def renew_all(
    database: Any,
    sql_for: Callable[[int], str],
    params_for: Callable[[Sequence[str]], Mapping[str, str]],
    tokens: Sequence[str],
) -> dict[str, tuple[str | None, Any]]:
    """``renew`` for any number of ``tokens``: one ``RENEWLEASE_<Q>`` call per
    ``MAX_QUERY_PARAMETERS`` tokens (Spanner refuses a statement with more parameters);
    ``sql_for(n)`` is the statement for n tokens, ``params_for(chunk)`` its parameters.
    ``RenewalOutcomeUnknown`` names the tokens of the calls whose answer was lost and carries
    the others' answers."""
    renewed: dict[str, tuple[str | None, Any]] = {}
    unknown: list[str] = []
    cause: BaseException | None = None
    for chunk in chunks(tokens, MAX_QUERY_PARAMETERS):
        try:
            renewed.update(renew(database, sql_for(len(chunk)), params_for(chunk)))
        except RenewalOutcomeUnknown as exc:
            unknown.extend(chunk)
            cause = exc.__cause__ or exc
    if cause is not None:  # (with the answers of the other calls)
        raise RenewalOutcomeUnknown(unknown, cause, renewed) from cause
    return renewed


def receive_stream(database: Any, session: Any, sql: str, timeout: float) -> Any:
    """Start ``RECEIVE_<Q>`` one level below ``Snapshot.execute_sql``: the raw
    ``ExecuteStreamingSql`` call on a strong single-use read-only transaction. Its
    ``_restart_on_unavailable`` would hold rows back until a PartialResultSet carries a resume
    token, retry UNAVAILABLE without back-off and resume RECEIVE with a token; here restarts are
    the ``ReceiveStream``'s. The call is the transport's own, wrapped only to map gRPC errors
    (``GoogleAPICallError``): the client's wrapper waits for the first response before it
    returns, so a call on an idle queue could not be ``cancel()``ed until a message came."""

    request = ExecuteSqlRequest(
        session=session.name,
        sql=sql,
        transaction=TransactionSelector(
            single_use=TransactionOptions(read_only=TransactionOptions.ReadOnly(strong=True))
        ),
        query_options=_merge_query_options(database._instance._client._query_options, None),
        request_options=RequestOptions(),
    )
    metadata = [
        *_metadata_with_prefix(database.name),
        ("x-goog-request-params", f"session={session.name}"),
    ]
    call = database.spanner_api.transport.execute_streaming_sql(
        request, metadata=metadata, timeout=timeout
    )
    return _StreamingResponseIterator(call, prefetch_first_result=False)


def rows_of(call: Any) -> Iterator[Any]:
    """Decoded rows of a streaming call, each as soon as its PartialResultSet arrives; then the
    call is read to its end. ``StreamedResultSet`` stops at the PartialResultSet marked
    ``last``, before the call's status: a call dropped then is cancelled by gRPC when it is
    collected, so a RECEIVE that ended by its ``max_duration`` would end cancelled whenever
    the status had not arrived yet."""
    yield from StreamedResultSet(call)
    for _ in call:  # after ``last``, only the status is left
        pass


#: gRPC statuses after which a sent commit may or may not have been applied.
UNKNOWN_OUTCOME = frozenset(
    {"UNAVAILABLE", "DEADLINE_EXCEEDED", "UNKNOWN", "INTERNAL", "CANCELLED"}
)


def commit_mutations(
    database: Any,
    *,
    sends: Sequence[tuple[str, tuple[Any, ...], bytes | str, datetime | None]] = (),
    acks: Sequence[tuple[str, tuple[Any, ...], bool | None]] = (),
) -> Any:
    """Commit ``Ack`` then ``Send`` mutations together (acks first, as Google requires when a
    batch replaces a message), in a read-write transaction of their own: its commit carries a
    transaction id, so the client's retries of ``Commit`` (on ``UNAVAILABLE``) cannot apply it
    twice nor report a refusal of its own first attempt; a single-use ("blind") commit is not
    idempotent. Payloads are wire values (``wire_payload``). Returns the commit timestamp.

    Raises ``CommitOutcomeUnknown`` when the commit was sent and its answer lost
    (``UNKNOWN_OUTCOME``): it may have been applied."""
    committing: list[Any] = []

    def work(txn: Any) -> None:
        committing.clear()
        for queue, key, ignore_not_found in acks:
            txn.ack(queue=queue, key=list(key), ignore_not_found=ignore_not_found)
        for queue, key, payload, deliver_time in sends:
            txn.send(queue=queue, key=list(key), payload=payload, deliver_time=deliver_time)
        committing.append(txn)  # what fails from here on fails in the commit

    try:
        database.run_in_transaction(work)
    except Exception as exc:
        # A transaction that never began (BeginTransaction failed) was never committed.
        began = bool(committing) and getattr(committing[0], "_transaction_id", True) is not None
        if began and grpc_status(exc) in UNKNOWN_OUTCOME:
            raise CommitOutcomeUnknown(
                f"The commit of {len(acks)} Ack and {len(sends)} Send mutations was sent and "
                f"its answer lost ({grpc_status(exc)}): it may or may not have been applied."
            ) from exc
        raise
    return committing[0].committed

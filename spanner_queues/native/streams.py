"""This process's ``RECEIVE_<Q>`` streams and the renewal of their leases.

One stream per (engine alias, queue) and process, shared by every thread (engines are per
thread, like database connections; streams must not be). A stream stopped by a permanent error
is started afresh by the next receive (the queue may have been created, or the permission
granted, since). Every stream is stopped at exit, so none outlives the program. A renewal of
in-flight messages renews, in the same ``RENEWLEASE_<Q>`` call, the rows the stream holds that
are due for renewal, while the stream is in use (``Receiver.held_tokens_due``). A demand is
first asked in a probe (``PROBE_MAX_DURATION_SECONDS``: one batch, no cancel). ``settle``
makes a stream's calls brief (``BRIEF_MAX_DURATION_SECONDS``) until it is stopped, and lets
its open call end (``Receiver.settle``).
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from spanner_queues.message import Message
from spanner_queues.native import client
from spanner_queues.native.messages import key_from_row
from spanner_queues.native.receive import Delivery, Receiver

if TYPE_CHECKING:
    from spanner_queues.engines.native import NativeQueueEngine
    from spanner_queues.models import Queue

#: Spanner's lease: 10 s from delivery or renewal, not configurable.
NATIVE_LEASE = timedelta(seconds=10)

#: ``max_duration`` of a probe (``Receiver``): a call that ends by itself after one batch.
PROBE_MAX_DURATION_SECONDS = 0.001

#: ``max_duration`` of a settled stream's calls (at most ``RECEIVE_MAX_DURATION_SECONDS``): a
#: caller that stops once nothing is due waits for the open call to end, so it is short.
BRIEF_MAX_DURATION_SECONDS = 2.0

_streams: dict[tuple[str, str], Receiver] = {}
#: streams whose calls are brief (``settle``), until stopped.
_brief: set[tuple[str, str]] = set()
_streams_lock = threading.Lock()
#: when (monotonic) this process last sent to a queue: (alias, label) -> time.
_last_sent: dict[tuple[str, str], float] = {}


def sent(alias: str, label: str) -> None:
    """This process sends to queue ``label`` on ``alias`` (``Receiver.take``: a call open since
    before it has not yet been shown that message, so a take waits its full wait for it)."""
    _last_sent[(alias, label)] = time.monotonic()


def last_sent(alias: str, label: str) -> float | None:
    """When this process last sent to queue ``label`` on ``alias`` (monotonic), or None."""
    return _last_sent.get((alias, label))


def stop_all_streams(wait: float | None = 5.0) -> None:
    """Stop every RECEIVE stream of this process (at exit, so none outlives the program)."""
    with _streams_lock:
        receivers = list(_streams.values())
        _streams.clear()
        _brief.clear()
    for receiver in receivers:
        receiver.stop(wait)


atexit.register(stop_all_streams)


def stop_streams(alias: str, label: str | None = None, wait: float | None = None) -> None:
    """Stop the streams of ``alias`` (of queue ``label`` only, when given); ``wait`` seconds
    for each to end. Leased rows not yet taken come back after their lease."""
    with _streams_lock:
        keys = [k for k in _streams if k[0] == alias and (label is None or k[1] == label)]
        receivers = [_streams.pop(k) for k in keys]
        _brief.difference_update(
            [k for k in _brief if k[0] == alias and (label is None or k[1] == label)]
        )
    for receiver in receivers:
        receiver.stop(wait)


def stream_for(engine: NativeQueueEngine, model: type[Queue], want: int = 1) -> Receiver:
    """The running stream of ``model`` on ``engine``'s alias, started if needed, told that a
    caller wants ``want`` messages."""
    label = model._meta.label
    stream_key = (engine.alias, label)
    with _streams_lock:
        receiver = _streams.get(stream_key)
        if receiver is not None and receiver.fatal is not None:
            # A permanent error stopped it (``take`` raised it): start afresh, the queue
            # may have been created or the permission granted since.
            del _streams[stream_key]
            receiver = None
        if receiver is None:
            receiver = _streams[stream_key] = _open(engine, model)
        receiver.want(want)
        receiver.start()
        return receiver


def brief_seconds(engine: NativeQueueEngine) -> float:
    """``max_duration`` of a settled stream's calls."""
    return min(BRIEF_MAX_DURATION_SECONDS, engine.max_duration_seconds)


def settle(engine: NativeQueueEngine, model: type[Queue], wait: float | None = None) -> bool:
    """Let this process's stream of ``model`` come to rest (``Receiver.settle``): its calls
    are brief from now on (until it is stopped), no new call opens until the next receive,
    and the open call is let end, ``wait`` seconds at most (default: a brief call's length
    and as much again). True (settled): no row is leased to this process's stream and
    unread."""
    stream_key = (engine.alias, model._meta.label)
    with _streams_lock:
        _brief.add(stream_key)
        receiver = _streams.get(stream_key)
    if receiver is None:
        return True
    if wait is None:
        wait = 2 * brief_seconds(engine) + 1.0
    return receiver.settle(wait)


def _open(engine: NativeQueueEngine, model: type[Queue]) -> Receiver:
    database = engine.spanner()
    decl = engine.declaration(model)
    n = len(decl.keys)
    payload_type = decl.payload_type
    current: dict[str, Any] = {}

    def open_stream(max_batch_size: int, *, brief: bool = False, probe: bool = False) -> Any:
        if probe:
            seconds = min(PROBE_MAX_DURATION_SECONDS, engine.max_duration_seconds)
        elif brief:
            seconds = brief_seconds(engine)
        else:
            seconds = engine.max_duration_seconds
        sql = engine.receive_sql(model, max_batch_size, max_duration_seconds=seconds)
        deadline = seconds + 30  # the call's own gRPC deadline
        with database.snapshot() as snapshot:  # a pooled session, as the client
            call = client.receive_stream(database, snapshot._session, sql, deadline)
            current["call"] = call
            try:
                yield from client.rows_of(call)
            finally:
                current.pop("call", None)

    def cancel() -> None:
        call = current.get("call")
        if call is not None:
            call.cancel()

    def parse(row: Sequence[Any]) -> Delivery:
        return Delivery(
            key=key_from_row(model, row[:n]),
            payload=client.payload_from_wire(payload_type, row[n]),
            deliver_time=row[n + 1],
            lease_token=row[n + 2],
            lease_expires_at=row[n + 3],
            last_in_batch=bool(row[n + 4]),
        )

    def renew(tokens: list[str]) -> dict[str, tuple[str | None, Any]]:
        return renew_tokens(engine, model, tokens, database)

    return Receiver(
        model._meta.label,
        open_stream,
        parse,
        buffer_size=engine.buffer_size,
        lease_margin=engine.lease_margin,
        cancel=cancel,
        renew=renew,
        batch_size=engine.batch_size,
        stall_seconds=NATIVE_LEASE.total_seconds() / 2,
        brief=(engine.alias, model._meta.label) in _brief,
        probe=True,
    )


def renew_tokens(
    engine: NativeQueueEngine, model: type[Queue], tokens: list[str], database: Any = None
) -> dict[str, tuple[str | None, Any]]:
    """``RENEWLEASE_<Q>`` for ``tokens``, one call per ``MAX_QUERY_PARAMETERS`` tokens (one
    parameter each): old token -> (new token, new expiry)."""
    return client.renew_all(
        database or engine.spanner(),
        lambda count: engine.renew_sql(model, count),
        engine.dialect.renew_params,
        tokens,
    )


def renew_leases(
    engine: NativeQueueEngine, model: type[Queue], messages: Sequence[Message]
) -> list[Message]:
    """One ``RENEWLEASE_<Q>`` call for ``messages`` and, together with them, the rows this
    process's stream holds for the queue that are due for renewal. Messages whose lease was
    lost are left out of the result."""
    with _streams_lock:
        receiver = _streams.get((engine.alias, model._meta.label))
    held = receiver.held_tokens_due() if receiver is not None else []
    tokens = list(dict.fromkeys([m.lease_token for m in messages if m.lease_token] + held))
    if not tokens:
        return []
    try:
        renewed = renew_tokens(engine, model, tokens)
    except BaseException:
        if held and receiver is not None:
            receiver.renewal_failed(held)
        raise
    if held and receiver is not None:
        receiver.apply_renewals(renewed, held)
    result = []
    for message in messages:
        new_token, expires = renewed.get(message.lease_token or "", (None, None))
        if new_token:  # no row, or a NULL new token: the lease is lost
            result.append(message.with_lease(new_token, expires))
    return result

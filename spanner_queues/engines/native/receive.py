"""The ``RECEIVE_<Q>`` loop: one background stream per queue and process, feeding a buffer.

``RECEIVE_<Q>`` is a long-running streaming query on a strong single-use snapshot; rows arrive
as messages become deliverable, each already leased to this stream. ``ReceiveStream.take`` hands
buffered rows to callers and drops those whose lease has (nearly) expired, since Spanner may
deliver them to someone else.

Leasing is bounded by demand, not by gRPC flow control (a client's flow-control window lets
the server run far ahead: 300 rows of 4 KB went through one): a call asks for what is wanted
(``max_batch_size`` = the demand not yet held, at most ``batch_size``), and is ended (cancelled)
at the end of the batch that meets the demand, instead of being read on. So the rows leased to
this process and not yet handed out stay within the demand plus one batch (plus what the
server sent before the cancel reached it). A new call opens only for a demand not met: a
``take`` waiting for more than is held, or one that returned short within ``linger``.

A cancel strands the rows the server sent before it arrived (leased to nobody until their
lease ends), and under a backlog it would strand some at every call. So with ``probe`` a demand
is first asked in a *probe*: a call with a tiny ``max_duration`` (``open_stream(...,
probe=True)``), which ends by itself after one batch. A probe that comes back full (a backlog)
is followed by another, which asks a whole batch (``batch_size``) whatever the demand left, so
a caller taking one message at a time costs one call per batch, not per message (held ahead:
within the demand plus one batch), and a ``take`` waits for it rather than return one batch
short of what it asked for; one that comes back short (nothing more due) by a long call, which
waits for messages to become due and is cancelled once its batch meets the demand.

Only a caller that keeps asking holds a stream: a call stays open ``linger`` seconds after the
last ``take`` returned (a worker asks again within moments), then it is ended, so a plain
``api.receive()`` leaves no call open for long and uses none of Spanner's active receive
queries. Held rows are renewed before their lease ends (by the engine's ``renew_leases``
together with the in-flight ones, or by the stream's own thread) only while the stream is in
use (a ``take`` waiting, or one within ``linger``): a row nobody takes is left to its lease
and goes back to the queue. A row whose renewal is on the wire is handed out only once it has
answered, with the renewed token (the one it had is rotated out). Rows that expire while held
are counted in ``lease_expiration_count``, as Spanner's metric of that name counts them.

A probe proves nothing when it comes back empty: Spanner documents no minimum
``max_duration`` and advises against very short ones, so an instance may answer a 1 ms call
with nothing while a backlog waits. An empty probe is always followed by a long call when a
demand is unmet, and never counts as a look (below). What a database answers to probes is
learnt once for all its streams (``Probes``, one per engine alias): a probe refused with
INVALID_ARGUMENT, whatever its words, turns probes off on that database and is asked again
once in a long call (only a long call's refusal is permanent); and once ``USELESS_PROBES``
probes came back empty right before a long call whose first row was due before the probe
opened, while no probe on that database ever brought a row, it probes no more (each probe
was a call for nothing).

``settle`` serves callers that stop once nothing is due (a burst worker). Rows a call leased
may still be on the wire when the buffer is empty, and cancelling the call would leave them
leased to nobody until their lease ends. So from the first ``settle`` on, calls are never
cancelled and read to their end: a backlog is still asked in probes (one batch each), the
other calls are *brief* (``open_stream(..., brief=True)``: a short ``max_duration``); a brief
call whose rows exceed the demand is read on once it is ``stall_seconds`` old (rows on the
wire were leased when sent and cannot be renewed until read). ``settle`` is True only after a
*look* that found nothing: the last call was no probe, ran to its ``max_duration`` (neither
cancelled nor broken) and brought no row. Until there is one, ``settle`` opens one such call
(a brief one) even without a ``take``; otherwise it opens no new call until the next
``take``, waits for the open one to end and says whether rows arrived. A ``take`` that
returned empty (``wait=0`` hands out only what is held) says nothing about the queue; a
caller that stops on it alone strands a backlog. A call broken by an error can still leave
rows leased: they come back after their lease.

``open_stream`` starts the call before it returns, so a ``stop()`` from then on cancels it; a
``stop()`` while it is opening is followed by a cancel once it returns.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from spanner_queues import clock
from spanner_queues.drivers import grpc_status
from spanner_queues.exceptions import (
    NotSupportedByEngine,
    QueueConfigurationError,
    QueueError,
    UnknownQueue,
)

logger = logging.getLogger("spanner_queues.engines.native.receive")

#: how long ``take`` waits when the open call has had time to bring what is due.
WARM_WAIT = 0.05

#: most keys of rows brought since the last look that a stream keeps (``settle``): past it,
#: the next ``settle`` looks again
SINCE_KEPT = 1000

#: most keys of rows dropped unread that a stream keeps to check before it settles
DROPPED_KEPT = 100

#: how long a stream's call stays open after the last ``take`` returned (a worker asks again
#: well within it; a plain ``api.receive()`` leaves the call open no longer).
LINGER_SECONDS = 1.0

#: empty probes, each followed by a long call whose first row was due before the probe
#: opened, after which a database that never answered a probe with a row probes no more
USELESS_PROBES = 3


class Probes:
    """What one database (an engine alias) answered to the 1 ms probes of its streams, shared
    by them and bounded (two flags and a count): probes are asked (``wanted``) until one is
    refused, or until ``USELESS_PROBES`` came back empty while the queue held rows due before
    them (``missed``), unless a probe ever brought a row (``brought``). Thread-safe."""

    def __init__(self, useless_limit: int = USELESS_PROBES) -> None:
        self._lock = threading.Lock()
        self._limit = useless_limit
        self.refused = False
        self.answered = False
        self.useless = 0

    @property
    def wanted(self) -> bool:
        with self._lock:
            return not self.refused and (self.answered or self.useless < self._limit)

    def refuse(self) -> None:
        with self._lock:
            self.refused = True

    def brought(self) -> None:
        """A probe brought a row: the database answers probes."""
        with self._lock:
            self.answered = True

    def missed(self, name: str) -> None:
        """A probe came back empty although a row was due when it opened."""
        with self._lock:
            if self.answered or self.refused:
                return
            self.useless += 1
            if self.useless != self._limit:
                return
        logger.warning(
            "RECEIVE for %s: %d probes came back empty while rows were due; no more probes "
            "on this database (it answers very short calls with nothing)",
            name,
            self._limit,
        )


def due_before_probe(row: LeasedRow, lease: timedelta, elapsed: float) -> bool:
    """Whether ``row``, the first a long call brought ``elapsed`` seconds (monotonic) after an
    empty probe opened, was due when the probe opened: it had waited, on Spanner's own clock
    (its lease's start, ``lease_expires_at - lease``, less its ``DeliverTime``), longer than
    ``elapsed`` (no client clock is compared with the server's)."""
    if row.deliver_time is None or row.lease_expires_at is None:
        return False
    waited = (row.lease_expires_at - lease - row.deliver_time).total_seconds()
    return waited > elapsed


#: Errors that no restart can cure: the stream stops and ``take`` raises them.
PERMANENT = frozenset(
    {"INVALID_ARGUMENT", "NOT_FOUND", "PERMISSION_DENIED", "UNIMPLEMENTED", "FAILED_PRECONDITION"}
)


def permanent_error(name: str, exc: BaseException) -> QueueError | None:
    """The ``QueueError`` for a permanent gRPC error of the stream, None when transient
    (UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, INTERNAL...: restarted)."""
    status = grpc_status(exc)
    if status not in PERMANENT:
        return None
    text = f"RECEIVE for {name} failed with {status}: {getattr(exc, 'message', exc)}"
    if status == "UNIMPLEMENTED":
        error: QueueError = NotSupportedByEngine(text)
    elif status == "NOT_FOUND":
        error = UnknownQueue(text)
    else:
        error = QueueConfigurationError(text)
    error.grpc_status = status  # type: ignore[attr-defined]
    error.__cause__ = exc  # (a lost session: the caller reconnects, Driver.is_connection_lost)
    return error


@dataclass(frozen=True, slots=True)
class LeasedRow:
    """One row of ``RECEIVE_<Q>``, leased to this process (its token and expiry)."""

    key: tuple[Any, ...]
    payload: bytes
    deliver_time: datetime | None
    lease_token: str
    lease_expires_at: datetime
    last_in_batch: bool


@dataclass(slots=True)
class _Call:
    """One ``RECEIVE_<Q>`` call of a stream, as its thread reads it."""

    #: RECEIVE's ``max_batch_size``
    batch: int
    #: a short ``max_duration``: never cancelled, read to its end
    brief: bool
    #: a one-batch call (a tiny ``max_duration``)
    probe: bool
    #: when it was asked for (``clock.now()``, the scale of lease expiries)
    opened_at: datetime
    #: when it opened (monotonic)
    opened: float = 0.0
    #: a brief call stalled: read on to its end, past the demand
    read_on: bool = False
    #: rows of the batch being read
    in_batch: int = 0
    #: keys of the rows it brought
    keys: list[tuple[Any, ...]] = field(default_factory=list)
    #: the last batch read was full: more may be due
    full: bool = False
    #: it ran to its end (its max_duration), neither cancelled nor broken
    ended: bool = False
    #: a probe refused: asked again at once in a long call
    refused: bool = False


class OpenStream(Protocol):
    """Runs one ``RECEIVE_<Q>`` call and returns its rows (see ``ReceiveStream``)."""

    def __call__(self, max_batch_size: int, *, brief: bool = ..., probe: bool = ...) -> Any: ...


class ReceiveStream:
    """A background ``RECEIVE_<Q>`` stream for one queue.

    ``open_stream(max_batch_size, brief=..., [probe=True])`` starts the query (``cancel``
    reaches it from its return on) and returns an iterable of its raw rows, read to its end
    (``brief``: with a short ``max_duration``, see ``settle``; ``probe``: a one-batch call,
    passed only with ``probe``); ``parse(row)`` turns a row into a ``LeasedRow``. ``brief``:
    calls are brief from the start. ``probes``: what the database answered to probes, shared
    with its other streams (default: this stream's own); ``lease``: Spanner's lease;
    ``present(keys)``: which of ``keys`` are in the queue now (``settle``).
    """

    def __init__(
        self,
        name: str,
        open_stream: OpenStream,
        parse: Callable[[Any], LeasedRow],
        *,
        buffer_size: int = 100,
        lease_margin: timedelta = timedelta(seconds=0.5),
        restart_delay: float = 0.2,
        max_restart_delay: float = 10.0,
        cancel: Callable[[], None] | None = None,
        renew: Callable[[list[str]], dict[str, tuple[str | None, Any]]] | None = None,
        renew_within: timedelta = timedelta(seconds=5),
        batch_size: int | None = 10,
        stall_seconds: float = 5.0,
        brief: bool = False,
        linger: float = LINGER_SECONDS,
        probe: bool = False,
        probes: Probes | None = None,
        lease: timedelta = timedelta(seconds=10),
        present: Callable[[list[tuple[Any, ...]]], Collection[tuple[Any, ...]]] | None = None,
    ) -> None:
        self.name = name
        self._open_stream = open_stream
        self._parse = parse
        self._cancel = cancel
        self._buffer: collections.deque[LeasedRow] = collections.deque()
        self._buffer_size = buffer_size
        #: how many rows may be held: what the last ``take`` asked for, up to buffer_size.
        self._cap = 1
        self._renew = renew
        self._renew_within = renew_within
        #: tokens of held rows whose renewal is on the wire: not handed out until it answers
        #: (a row taken meanwhile would leave with the token the renewal rotates out)
        self._renewing: set[str] = set()
        #: RECEIVE's max_batch_size: the setting, but never more than is asked for.
        self._batch_size = batch_size
        #: brief calls only: how long a full buffer waits before the call is read on.
        self._stall_seconds = stall_seconds
        self._linger = linger
        #: ``open_stream(..., probe=True)`` opens a one-batch call (a tiny ``max_duration``)
        self._probe = probe
        #: what the database answered to probes (shared by its streams)
        self._probes = probes if probes is not None else Probes()
        self._lease = lease
        #: when (monotonic) the last call, an empty probe, opened; None after any other call
        self._empty_probe: float | None = None
        #: which of some keys are in the queue now (``settle``: rows dropped unread)
        self._present = present
        #: keys of rows dropped unread and not brought again since (at most ``DROPPED_KEPT``)
        self._dropped: set[tuple[Any, ...]] = set()
        #: the next call is a probe: a new demand, or the last probe came back full
        self._probe_next = True
        #: the last call was a probe that came back full: more is due, and the next probe is
        #: on its way for a demand not met (a ``take`` waits for it rather than return short)
        self._backlog = False
        #: takes waiting now, the messages they ask for together, and when the last one
        #: returned (monotonic)
        self._waiting = 0
        self._asked = 0
        self._last_wanted = time.monotonic()
        #: until when (monotonic) the last take's unmet demand may open a new call
        self._unmet_until = 0.0
        #: the open call is being ended by this stream (its error is no failure)
        self._ending = False
        self._renewer: threading.Thread | None = None
        self._margin = lease_margin
        self._restart_delay = restart_delay
        self._max_restart_delay = max_restart_delay
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._batch_open = False
        #: calls are brief and read to their end (``settle``).
        self._brief = brief
        #: ``settle`` asked for no new call until the next ``take``.
        self._resting = False
        #: ``settle`` asked for a look (a brief call, no probe) although no ``take`` waits.
        self._confirm = False
        #: a ``take`` (``want``) ever asked this stream for rows
        self._wanted = False
        #: keys of the rows the last *look* brought (a call that was no probe and ended by
        #: its ``max_duration``), None before the first; empty: nothing was due while it was
        #: open. ``_since``: keys the calls after it brought (None: more than ``SINCE_KEPT``).
        self._looked: list[tuple[Any, ...]] | None = None
        self._since: list[tuple[Any, ...]] | None = []
        #: when the last look opened (``clock.now()``, the scale of lease expiries).
        self._looked_at: datetime | None = None
        #: the latest lease end of rows dropped unread (expired or renewal lost): until
        #: then they are leased and invisible, so only a look opened after it proves them
        #: gone (``_nothing_new``).
        self._reappear_at: datetime | None = None
        #: a RECEIVE call is open (set and cleared under ``_cond``).
        self._calling = False
        #: when the RECEIVE call now open was started (monotonic); None between calls.
        self._open_since: float | None = None
        self._thread: threading.Thread | None = None
        self.streams_started = 0
        #: RECEIVE calls that have ended (by their max_duration, a cancel or an error)
        self.calls_ended = 0
        #: held rows whose lease ended before they were handed out (Spanner's metric name).
        self.lease_expiration_count = 0
        self.last_error: BaseException | None = None
        #: a permanent error: the stream has stopped and ``take`` raises it.
        self.fatal: QueueError | None = None

    # --- lifecycle -----------------------------------------------------------------------
    def want(self, max_messages: int) -> None:
        """How many rows the next ``take`` asks for: the stream holds (and a new RECEIVE call
        batches) no more than this."""
        with self._cond:
            self._cap = max(1, min(max_messages, self._buffer_size))
            self._resting = False
            self._confirm = False
            self._wanted = True
            self._last_wanted = time.monotonic()
            self._cond.notify_all()

    def start(self) -> None:
        with self._cond:
            if (self._thread is None or not self._thread.is_alive()) and self.fatal is None:
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name=f"spanner-queues-receive-{self.name}", daemon=True
                )
                self._thread.start()
            if self.fatal is None and (self._renewer is None or not self._renewer.is_alive()):
                self._renewer = threading.Thread(
                    target=self._watch, name=f"spanner-queues-renew-{self.name}", daemon=True
                )
                self._renewer.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop reading; rows already leased but not taken are dropped (they are redelivered
        when their lease expires). The stream's gRPC call is cancelled, so the thread ends
        promptly; ``timeout`` waits for it."""
        self._stop.set()
        self._cancel_stream()
        with self._cond:
            self._buffer.clear()
            self._cond.notify_all()
        if self._thread is not None and timeout:
            self._thread.join(timeout)
        if self._renewer is not None and timeout:
            self._renewer.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- the stream ----------------------------------------------------------------------
    def _demand(self) -> int:
        """How many rows the stream may hold: what the takes waiting now ask for together,
        at least what the last one asked for, at most ``buffer_size`` (under ``_cond``)."""
        return max(1, min(max(self._cap, self._asked), self._buffer_size))

    def _unmet(self) -> bool:
        """A ``take`` is waiting, or the last one returned short within ``linger``."""
        return self._waiting > 0 or time.monotonic() < self._unmet_until

    def _in_use(self) -> bool:
        """A ``take`` is waiting, or one returned within ``linger`` (under ``_cond``)."""
        return self._waiting > 0 or time.monotonic() - self._last_wanted < self._linger

    def _run(self) -> None:
        """The stream's thread: one ``RECEIVE_<Q>`` call after another, each for a demand not
        met (``_next_call``), read into the buffer (``_read``); a failed call is restarted
        after a back-off, a permanent error ends the stream (``fatal``)."""
        failures = 0
        while not self._stop.is_set():
            call = self._next_call()
            if call is None:
                return
            try:
                if not self._read(call):
                    return
                if failures:
                    logger.info(
                        "RECEIVE stream for %s recovered after %d failed calls", self.name, failures
                    )
                failures = 0  # max_duration elapsed (or held enough): call RECEIVE again
            except Exception as exc:  # UNAVAILABLE, RESOURCE_EXHAUSTED, a dropped queue...
                if self._stop.is_set():  # cancelled by stop()
                    return
                if self._ending:  # our own cancel
                    continue
                if call.probe and grpc_status(exc) == "INVALID_ARGUMENT":
                    # Spanner documents no minimum max_duration, nor the words of a refusal:
                    # whatever a probe's refusal says, ask in long calls from now on. The
                    # long call is asked at once; its own refusal is permanent.
                    logger.warning(
                        "RECEIVE for %s refused a probe (%s); no more probes on this database",
                        self.name,
                        exc,
                    )
                    self._probes.refuse()
                    call.refused = True
                    continue
                self.last_error = exc
                failures += 1
                if not self._back_off(exc, failures):
                    return
            finally:
                self._call_over(call)

    def _next_call(self) -> _Call | None:
        """Wait for a demand not met (or a look ``settle`` asks for), then say what the next
        call asks: None once stopped."""
        with self._cond:  # a new call only for a demand not met, for what it lacks
            while (
                len(self._buffer) >= self._demand() or self._resting or not self._unmet()
            ) and not (self._stop.is_set() or self._confirm):
                self._cond.wait(0.5)
            if self._stop.is_set():
                return None
            self._calling = True  # with the check above: ``settle`` sees no gap
            self._ending = False
            confirm, self._confirm = self._confirm, False
            # RECEIVE's max_batch_size: the demand not yet held, at most the setting; under a
            # backlog (the last probe came back full), for a take waiting now, a whole batch,
            # so that a demand of one does not cost a call per message: what is held stays
            # within the demand plus one batch, and within the buffer (a take that returned
            # short asks no more than it lacked: it may not come back).
            demand = self._demand()
            lacking = demand - len(self._buffer)
            if self._backlog and self._batch_size and self._waiting > 0:
                lacking = max(lacking, min(self._batch_size, self._buffer_size - len(self._buffer)))
            return _Call(
                opened_at=clock.now(),  # (a look proves nothing about rows leased before)
                batch=max(1, min(lacking, self._batch_size or demand)),
                brief=self._brief,
                # (brief or not: a backlog is asked in probes, which lease one batch each; a
                # look asked by ``settle`` is no probe: an empty probe proves nothing)
                probe=self._probe and self._probe_next and not confirm and self._probes.wanted,
            )

    def _read(self, call: _Call) -> bool:
        """Open ``call`` and read its rows into the buffer, to its end or until it is ended
        at a batch's end (the demand met). False once stopped."""
        self.streams_started += 1
        call.opened = self._open_since = time.monotonic()
        rows = (
            self._open_stream(call.batch, brief=call.brief, probe=True)
            if call.probe
            else (self._open_stream(call.batch, brief=call.brief))
        )
        if self._stop.is_set():  # a stop() while the call was opening cancelled
            self._cancel_stream()  # nothing: cancel it now that it exists
        for row in rows:
            leased = self._parse(row)
            if self._empty_probe is not None and not call.probe:  # its first row
                if due_before_probe(leased, self._lease, time.monotonic() - self._empty_probe):
                    self._probes.missed(self.name)
                self._empty_probe = None
            end = self._hold(call, leased)
            if end is None:
                return False
            if end:
                self._cancel_stream()
                return True
        call.ended = not self._ending and not self._stop.is_set()
        return True

    def _hold(self, call: _Call, row: LeasedRow) -> bool | None:
        """Put one row of ``call`` in the buffer. True: end the call here (the demand is met,
        or nobody asks any more, at a batch's end); None: stopped."""
        call.in_batch += 1
        call.keys.append(row.key)
        if row.last_in_batch:
            call.full, call.in_batch = call.in_batch >= call.batch, 0
        with self._cond:
            self._dropped.discard(row.key)  # (it came back: no longer to look for)
            if self._stop.is_set():
                return None
            self._buffer.append(row)
            self._batch_open = not row.last_in_batch
            self._cond.notify_all()
            if call.brief:
                # It ends soon: never cancel rows on the wire. Held enough: read no further
                # for a while, then read on to the call's end. The while counts from the
                # call's start, not from this row: rows on the wire were leased then and
                # cannot be renewed until read.
                while (
                    len(self._buffer) >= self._demand()
                    and not call.read_on
                    and not self._stop.is_set()
                ):
                    left = self._stall_seconds - (time.monotonic() - call.opened)
                    if left <= 0:
                        call.read_on = True
                        break
                    self._cond.wait(min(0.5, left))
            elif not self._batch_open and (
                len(self._buffer) >= self._demand() or not self._in_use()
            ):
                # The demand is met (or nobody asks any more): end the call at this batch's
                # end rather than read (and lease) ahead. A new call starts when a take wants
                # more.
                self._ending = True
                return True
        return False

    def _back_off(self, exc: Exception, failures: int) -> bool:
        """After a failed call (``failures`` in a row): False on a permanent error (the
        stream ends with ``fatal``), else wait the back-off and say True."""
        fatal = permanent_error(self.name, exc)
        if fatal is not None:
            logger.error("%s; not restarting", fatal)
            with self._cond:
                self.fatal = fatal
                self._batch_open = False
                self._cond.notify_all()
            return False
        delay = min(self._restart_delay * (2 ** min(failures - 1, 8)), self._max_restart_delay)
        if failures == 1:  # the first of an episode; the rest at debug level
            logger.warning(
                "RECEIVE stream for %s failed (%s); restarting in %.1f s; further "
                "failures are logged at debug level until it recovers",
                self.name,
                exc,
                delay,
            )
        else:
            logger.debug(
                "RECEIVE stream for %s failed again (%d in a row: %s); restarting in %.1f s",
                self.name,
                failures,
                exc,
                delay,
            )
        with self._cond:  # the call is over: a settle need not wait out the back-off
            self._calling = False
            self._cond.notify_all()
        self._stop.wait(delay)
        return True

    def _call_over(self, call: _Call) -> None:
        """Record what ``call`` told about the queue, however it ended."""
        self._open_since = None
        with self._cond:
            # A probe that came back full: a backlog, probe again. One that came back short:
            # nothing more is due, wait in a long call. After a long call, the next demand
            # probes first.
            self._probe_next = call.full if call.probe else True
            if call.probe and call.keys:
                self._probes.brought()
            # an empty probe that ran to its end: the next call's first row tells whether a
            # row was due while it looked
            self._empty_probe = call.opened if call.probe and call.ended and not call.keys else None
            if call.ended and not call.probe:
                self._looked, self._since = call.keys, []
                self._looked_at = call.opened_at
            elif self._since is not None and call.keys:
                self._since.extend(call.keys)
                if len(self._since) > SINCE_KEPT:
                    self._since = None
            self._backlog = call.probe and call.full and not self._stop.is_set()
            self._batch_open = False
            self._calling = False
            if not call.refused:  # (its long call is the first answer a take waits for)
                self.calls_ended += 1
            self._cond.notify_all()

    def _cancel_stream(self) -> None:
        if self._cancel is not None:
            try:
                self._cancel()
            except Exception:  # already finished
                logger.debug("cancelling the RECEIVE stream of %s failed", self.name, exc_info=True)

    # --- consumers -----------------------------------------------------------------------
    def _drop_expired(self) -> None:
        limit = clock.now() + self._margin
        kept = []
        for d in self._buffer:
            if d.lease_expires_at > limit:
                kept.append(d)
            else:
                self._forget(d)
        self._buffer = collections.deque(kept)

    def _forget(self, delivery: LeasedRow) -> None:
        """A held row is dropped unread: count it, and remember when its lease ends at the
        latest (``_reappear_at``), when it is due again (``_cond``)."""
        self.lease_expiration_count += 1
        if len(self._dropped) < DROPPED_KEPT:
            self._dropped.add(delivery.key)
        ends = delivery.lease_expires_at
        if ends is not None and (self._reappear_at is None or ends > self._reappear_at):
            self._reappear_at = ends

    def settle(self, wait: float, ignore: Collection[tuple[Any, ...]] = ()) -> bool:
        """For a caller about to stop because nothing is due: make calls brief (from the
        next one on), and wait up to ``wait`` seconds for the open call to end by its
        ``max_duration`` (it is not cancelled), or for a row. Unless the last *look* (a call
        that was no probe and ran to its ``max_duration``) and every call since brought no row
        but ``ignore``'s, a brief call is opened to look; no other new call opens until the
        next ``take``. True (settled): no call is open, that look found nothing due but rows
        keyed in ``ignore`` (the caller handled them: given back, no receiver of its release
        matches them), and nothing else is held: no row is leased to this stream and unread
        but ignored ones, which are left to their lease. False: other rows are held (``take``
        them), or a call is open or still to come (ask again). A stream never asked for a row
        is settled."""
        deadline = time.monotonic() + wait
        with self._cond:
            self._brief = True
            self._resting = True
            if not self._wanted:
                return not self._buffer  # nobody ever asked: nothing was leased
            while not (self._stop.is_set() or self.fatal is not None):
                self._drop_expired()
                if any(d.key not in ignore for d in self._buffer):
                    return False
                pause = remaining = deadline - time.monotonic()
                if not self._calling and not self._confirm:
                    if self._nothing_new(ignore) and not self._dropped_left(ignore):
                        # Rows held are the caller's ignored ones (no receiver of its
                        # release): left to their lease, as a stopped stream leaves them.
                        self.lease_expiration_count += len(self._buffer)
                        self._buffer.clear()
                        return True
                    # Rows dropped unread are due again once their lease ends: a look opened
                    # before then would find nothing and prove nothing; wait for it.
                    reappear = self._reappear_in()
                    if reappear > 0:
                        pause = min(remaining, reappear)
                    else:
                        self._confirm = True  # look once more, in a brief call
                self._cond.notify_all()
                if remaining <= 0:
                    return False
                self._cond.wait(pause)
            # stopped (by ``stop`` or a permanent error): no call is open any more
            return not self._buffer

    def _nothing_new(self, ignore: Collection[tuple[Any, ...]]) -> bool:
        """The last look, and every call since, brought no row but ``ignore``'s (``_cond``)."""
        if self._looked is None or self._since is None:
            return False
        if self._reappear_at is not None and (
            self._looked_at is None or self._looked_at <= self._reappear_at
        ):
            return False  # rows dropped unread were still leased when it looked
        return all(k in ignore for k in self._looked) and all(k in ignore for k in self._since)

    def _dropped_left(self, ignore: Collection[tuple[Any, ...]]) -> bool:
        """Whether a row dropped unread is still in the queue (under ``_cond``, released while
        the queue is read). A look that found nothing after its lease ended does not prove it
        gone: Spanner's back-off after an unread lease is undocumented and may hand it back
        later. Still there (leased elsewhere or backing off): the last look no longer counts,
        so ``settle`` looks again (in brief calls) until it comes back or is gone. Gone keys
        are forgotten. A read that fails says nothing: still there, unless the error is
        permanent (the queue or the permission gone: logged, the rule falls back to the
        lease's end)."""
        keys = [k for k in self._dropped if k not in ignore]
        if not keys or self._present is None:
            return False
        self._cond.release()
        try:
            left = set(self._present(keys))
        except Exception as exc:
            if permanent_error(self.name, exc) is not None:
                logger.warning(
                    "%s: cannot read whether rows dropped unread are still queued (%s); "
                    "settling on their lease's end",
                    self.name,
                    exc,
                )
                left = set()
            else:
                logger.debug("%s: reading dropped rows failed", self.name, exc_info=True)
                left = set(keys)
        finally:
            self._cond.acquire()
        self._dropped.difference_update(set(keys) - left)
        if left:
            self._looked = None  # look again: the row may come back after its back-off
        return bool(left)

    def _reappear_in(self) -> float:
        """Seconds until the rows dropped unread are due again (0: they are) (``_cond``)."""
        if self._reappear_at is None:
            return 0.0
        return max(0.0, (self._reappear_at - clock.now()).total_seconds())

    @property
    def calling(self) -> bool:
        """A RECEIVE call is open."""
        return self._calling

    @property
    def brief(self) -> bool:
        """Calls are brief (``settle``)."""
        return self._brief

    @property
    def held(self) -> int:
        """Rows leased by the stream and not yet handed out."""
        return len(self._buffer)

    # --- renewal of held rows --------------------------------------------------------------
    def held_tokens_due(self) -> list[str]:
        """Tokens of held rows whose lease ends within ``renew_within``, while the stream is
        in use (a ``take`` waiting or one within ``linger``); none otherwise: rows nobody
        takes are left to their lease. The caller renews them and then calls
        ``apply_renewals`` (or ``renewal_failed``): until then ``take`` hands none of them
        out."""
        limit = clock.now() + self._renew_within
        with self._cond:
            if not self._in_use():
                return []
            due = [
                d.lease_token
                for d in self._buffer
                if d.lease_expires_at <= limit and d.lease_token not in self._renewing
            ]
            self._renewing.update(due)
            return due

    def renewal_failed(self, asked: list[str]) -> None:
        """The renewal of ``asked`` (from ``held_tokens_due``) failed: they may be taken."""
        with self._cond:
            self._renewing.difference_update(asked)
            self._cond.notify_all()

    def apply_renewals(self, renewed: dict[str, tuple[str | None, Any]], asked: list[str]) -> None:
        """Carry renewed tokens forward; drop (and count) held rows whose renewal was lost.
        A token renewed to itself is kept as it was (the renewal's answer was lost: its old
        lease holds until its expiry, when ``take`` drops it)."""
        asked_set = set(asked)
        with self._cond:
            kept: collections.deque[LeasedRow] = collections.deque()
            for d in self._buffer:
                if d.lease_token not in asked_set:
                    kept.append(d)
                    continue
                new, expires = renewed.get(d.lease_token, (None, None))
                if new == d.lease_token:
                    kept.append(d)
                elif new:
                    kept.append(replace(d, lease_token=new, lease_expires_at=expires))
                else:
                    self._forget(d)
            self._buffer = kept
            self._renewing.difference_update(asked)
            self._cond.notify_all()

    def _watch(self) -> None:
        """End a call nobody uses any more (no ``take`` within ``linger``; brief calls end on
        their own), and renew held rows nobody else renewed, about halfway through their
        lease, while the stream is in use."""
        tick = max(0.05, min(0.5, self._linger / 4))
        while not self._stop.wait(tick):
            with self._cond:
                idle = self._calling and not self._brief and not self._in_use()
                if idle:
                    self._ending = True
                    self._cancel_stream()
            if self._renew is None:
                continue
            tokens = self.held_tokens_due()
            if not tokens:
                continue
            try:
                renewed = self._renew(tokens)
            except Exception as exc:  # transient: the next round tries again
                self.renewal_failed(tokens)
                logger.warning("renewing held rows of %s failed: %s", self.name, exc)
                continue
            self.apply_renewals(renewed, tokens)

    def _pop(self, count: int) -> list[LeasedRow]:
        """Hand out up to ``count`` held rows, oldest first, none under renewal (``_cond``)."""
        if not self._renewing:
            return [self._buffer.popleft() for _ in range(min(count, len(self._buffer)))]
        taken: list[LeasedRow] = []
        kept: collections.deque[LeasedRow] = collections.deque()
        for d in self._buffer:
            if len(taken) < count and d.lease_token not in self._renewing:
                taken.append(d)
            else:
                kept.append(d)
        self._buffer = kept
        return taken

    def _take_wait(
        self, wait: float, last_sent: float | None, first_answer: float
    ) -> tuple[float, bool]:
        """How long ``take`` waits for a first row (see ``take``), and whether it waits for
        the stream's first call to end (it has not, and ``first_answer`` is the longer)."""
        opened = self._open_since
        if (
            opened is not None
            and time.monotonic() - opened >= wait
            and (last_sent is None or last_sent < opened)
        ):
            wait = min(wait, WARM_WAIT)
        if self.calls_ended == 0 and self.fatal is None and first_answer > wait:
            return first_answer, True
        return wait, False

    def take(
        self,
        max_messages: int,
        wait: float,
        *,
        last_sent: float | None = None,
        first_answer: float = 0.0,
    ) -> list[LeasedRow]:
        """Up to ``max_messages`` leased rows. Waits at most ``wait`` seconds for the first
        (only a moment when a call has been open that long and brought nothing, and this
        process sent nothing to the queue since it opened, ``last_sent`` (monotonic): nothing
        is due), then for the rest of its batch (``SpannerLastBatchMessage``), and under a
        backlog (the last probe came back full) for the probes that bring the rest of
        ``max_messages``. A stream whose
        first call has not ended is waited for up to ``first_answer`` seconds, until that call
        ends (a probe that found nothing due) or fails (a permanent error is raised here): a
        caller that waits for nothing still hears that its queue is gone."""
        wait, unanswered = self._take_wait(wait, last_sent, first_answer)
        deadline = time.monotonic() + wait
        self.want(max_messages)
        with self._cond:
            self._waiting += 1
            self._asked += max_messages
            # (wake the stream's thread: it may have looked at the demand before this take
            # counted itself, and would otherwise sleep out its poll, longer than ``wait``)
            self._cond.notify_all()
            try:
                while True:
                    if self.fatal is not None and not self._buffer:
                        raise self.fatal
                    self._drop_expired()
                    # (rows whose renewal is on the wire wait for its answer: ``_renewing``)
                    free = sum(1 for d in self._buffer if d.lease_token not in self._renewing)
                    enough = free >= max_messages
                    # a batch ended; under a backlog (a full probe) the next probe brings the
                    # rest of the demand at once: one unit of it, not one per RECEIVE batch
                    batch_done = free > 0 and not self._batch_open and not self._backlog
                    remaining = deadline - time.monotonic()
                    answered = unanswered and self.calls_ended > 0  # its first call ended
                    if enough or batch_done or answered or remaining <= 0:
                        taken = self._pop(max_messages)
                        short = len(taken) < max_messages
                        break
                    self._cond.wait(remaining)
            finally:
                self._waiting -= 1
                self._asked -= max_messages
                self._last_wanted = time.monotonic()
                self._cond.notify_all()
            # Asked for more than it got: a call may still open (or stay open) for the rest,
            # within ``linger``; a demand met opens none.
            self._unmet_until = self._last_wanted + self._linger if short else 0.0
            return taken

"""``RECEIVE_<Q>(...)`` served by the front: a long-running stream of batches, each leased in a
read-write transaction of the front's own (``queues.claim``), until ``max_duration`` elapses,
the client cancels or the front shuts down.

- RECEIVE runs only in a strong read-only transaction: single use, or one the front saw begun
  strong (``remember_strong_read``); anything else is ``INVALID_ARGUMENT``.
- A *short* call (``max_duration`` under ``SHORT_RECEIVE_SECONDS``; Google advises against very
  short durations and documents no minimum, nor what Spanner does with one) is answered as the
  front is told (``--short-receive``, ``SPANNER_QUEUES_EMULATOR_SHORT_RECEIVE``, or
  ``FrontControl.configure(short_receive=...)``, one of ``SHORT_RECEIVE_MODES``):
  ``generous`` (the default) looks at its queue at least once, whatever its duration (a probe
  of 1 ms on a loaded machine would otherwise end before its first look and return nothing
  that is due); ``empty`` answers nothing, ending when its duration has passed without a look,
  while messages may be due; ``refuse`` fails it with ``INVALID_ARGUMENT`` in words that do
  not say "duration" (``SHORT_REFUSAL``). Calls of ``SHORT_RECEIVE_SECONDS`` or more always
  look at least once.
- An idle stream looks at its queue again when a commit through the front sent to that queue
  (``committed``: by ``INSERT``, ``Send`` or a batch given back), when the earliest scheduled
  message (or lease) falls due, and at most every ``IDLE_POLL_SECONDS`` otherwise. A send
  between a look and the wait after it is not missed (the wait compares counts of sends, not
  wake-ups). Commits that send nothing (acks, other tables) wake no stream: each look is a
  strong read, and Google's emulator makes every read it serves a little slower for good
  (``benchmarks/emulator_aging.py``). Rows a stream leased are sent before it ends.
- A batch is leased only as it is sent: one leased while the client cancelled (or the front
  stopped) is given back at once (``unclaim``), as if never leased. Rows handed to gRPC stay
  leased: what a client that stops reading without cancelling lets through its flow-control
  window is leased, as on Spanner, where a RECEIVE row is leased when the server produces it.
- Every batch carries a resume token (Google's client holds rows back until one arrives),
  unless the front is configured without (``faults``); resuming with it starts a new RECEIVE,
  and rows already sent stay leased to the first call.
- ``end_streams()`` ends the streams open now as their ``max_duration`` would (later ones run
  as usual); ``started()`` hears of each call and gives the callback that hears how it
  ended: ``"ended"`` or ``"cancelled"``.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

import grpc

from spanner_queues_emulator import backend as b
from spanner_queues_emulator import queues as q
from spanner_queues_emulator import schema as s
from spanner_queues_emulator import statements as st
from spanner_queues_emulator import status
from spanner_queues_emulator.answers import BACKOFF_POLICIES
from spanner_queues_emulator.semantics import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_DURATION,
    parse_duration,
)

logger = logging.getLogger("spanner_queues_emulator")

#: how long an idle RECEIVE sleeps at most between looks at its queue: the net for a write
#: the front cannot tell a send (a queue written to around the front); a send through the
#: front wakes the queue's streams at once.
IDLE_POLL_SECONDS = 2.0
#: a RECEIVE whose ``max_duration`` is shorter is *short* (see the module docstring).
SHORT_RECEIVE_SECONDS = 1.0
#: how the front answers a short RECEIVE (see the module docstring); the first is the default.
SHORT_RECEIVE_MODES = ("generous", "empty", "refuse")
#: the environment variable that chooses the mode of ``python -m spanner_queues_emulator``
#: and of ``QueueEmulator`` when none is given.
SHORT_RECEIVE_ENV = "SPANNER_QUEUES_EMULATOR_SHORT_RECEIVE"
#: the refusal of a short RECEIVE in ``refuse`` mode (no "duration" in it: Google documents
#: no words for it, and a client must not rely on any).
SHORT_REFUSAL = "RECEIVE_{queue}: argument {value!r} is out of the allowed range"


def short_receive_mode(value: str | None = None) -> str:
    """``value``, else ``SHORT_RECEIVE_ENV``, else ``generous``; ``ValueError`` when it is not
    one of ``SHORT_RECEIVE_MODES``."""
    mode = value if value is not None else os.environ.get(SHORT_RECEIVE_ENV) or "generous"
    if mode not in SHORT_RECEIVE_MODES:
        raise ValueError(
            f"short_receive must be one of {', '.join(SHORT_RECEIVE_MODES)}, not {mode!r}"
        )
    return mode


#: how many strong read-only transactions are remembered (the oldest are forgotten first).
STRONG_READS_KEPT = 10000


class Receiving:
    """The RECEIVE streams of one front, and what they wait on."""

    def __init__(
        self,
        backend: b.Backend,
        started: Callable[[], Callable[[str], None]] | None = None,
        resume_tokens: Callable[[], bool] = lambda: True,
        short_receive: Callable[[], str] = lambda: "generous",
        backoff: Callable[[], str] = lambda: "exponential",
        deliver_time: Callable[[], str] = lambda: "kept",
    ) -> None:
        self.backend = backend
        self._started = started
        self._resume_tokens = resume_tokens
        self._short_receive = short_receive
        #: the back-off mode (``answers.BACKOFF_MODES``) of the claims
        self._backoff = backoff
        #: what a lease does to ``DeliverTime`` (``queues.DELIVER_TIME_MODES``)
        self.deliver_time = deliver_time
        self._generation = 0  # end_streams() ends the streams of the current generation
        self._lock = threading.Lock()
        self._commits = threading.Condition()
        #: sends seen per (database, QUEUE) and wake-ups of every stream (under ``_commits``):
        #: a stream waits until its queue's count moves, not for the next notification
        self._sends: collections.Counter[tuple[str, str]] = collections.Counter()
        self._everything = 0
        self._strong_reads: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self.stopping = threading.Event()

    def shutdown(self) -> None:
        """End open streams (they look at ``stopping`` after each wait)."""
        self.stopping.set()
        self.committed()

    def end_streams(self) -> None:
        """End the streams open now, as their ``max_duration`` would."""
        with self._commits:
            self._generation += 1
            self._commits.notify_all()

    def committed(self, database: str | None = None, queues: Iterable[str] | None = None) -> None:
        """A commit through the front sent to ``queues`` of ``database`` (None: it may have
        sent to any queue): wake their idle streams."""
        with self._commits:
            if database is None or queues is None:
                self._everything += 1
            else:
                for name in queues:
                    self._sends[(database, name.upper())] += 1
            self._commits.notify_all()

    def forget(self, database: str) -> None:
        """``database`` was dropped: its counts go."""
        with self._commits:
            for key in [k for k in self._sends if k[0] == database]:
                del self._sends[key]

    def _mark(self, database: str, queue: s.QueueSchema) -> tuple[int, int]:
        """What a stream's wait compares: the sends to its queue and the wake-ups of all
        (call under ``_commits``)."""
        return self._everything, self._sends[(database, queue.name.upper())]

    def remember_strong_read(self, transaction_id: bytes) -> None:
        """``transaction_id`` was begun read-only and strong: RECEIVE may run in it."""
        with self._lock:
            self._strong_reads[transaction_id] = None
            while len(self._strong_reads) > STRONG_READS_KEPT:
                self._strong_reads.popitem(last=False)

    def stream(
        self, req: Any, database: str, call: st.QueueCall, queue: s.QueueSchema, context: Any
    ) -> Iterator[bytes]:
        """Serve ``call`` (a parsed RECEIVE of ``queue``) for ``req``: serialized
        ``PartialResultSet`` messages, metadata on the first; ends the call on a refusal."""
        ended = self._started() if self._started is not None else None
        try:
            yield from self._stream(req, database, call, queue, context)
        finally:
            if ended is not None:
                ended("ended" if context.is_active() else "cancelled")

    def _stream(
        self, req: Any, database: str, call: st.QueueCall, queue: s.QueueSchema, context: Any
    ) -> Iterator[bytes]:
        generation = self._generation
        batch, duration, short = self._receive_args(req, call, queue, context)
        deadline = time.monotonic() + duration
        done = threading.Event()

        def cancelled() -> None:
            done.set()
            with self._commits:
                self._commits.notify_all()

        context.add_callback(cancelled)
        sent_metadata = False
        batches = 0
        # A call looks at its queue at least once, however short its duration; a short one
        # answered ``empty`` never looks.
        looked = short == "empty"
        if looked:
            done.wait(duration)
        while not (done.is_set() or self.stopping.is_set()) and (
            not looked or (time.monotonic() < deadline and generation == self._generation)
        ):
            looked = True
            with self._commits:
                mark = self._mark(database, queue)
            try:
                earliest = q.has_due(self.backend, database, queue)
                claimed = None
                if earliest is not None and earliest <= q.now():
                    claimed = q.claim(
                        self.backend,
                        database,
                        queue,
                        batch,
                        BACKOFF_POLICIES[self._backoff()],
                        self.deliver_time(),
                    )
            except grpc.RpcError as exc:
                status.abort_with(context, exc)
            if claimed is not None and claimed.rows:
                batches += 1
                partial = self._batch(claimed, call, batches, metadata=not sent_metadata)
                sent_metadata = True
                if done.is_set() or self.stopping.is_set():  # ended while leasing: not sent
                    self._unclaim(database, queue, claimed)
                    return
                # (a call cancelled while gRPC sends it is not told whether the send went
                # through: that batch stays leased, as the rows of a window a client let in)
                yield partial.SerializeToString()
                continue
            self._idle(earliest, deadline, generation, database, queue, mark, done)
        if not sent_metadata:
            fields, _ = q.project(receive_fields(self.backend, database, queue), [], call.columns)
            yield b.PartialResultSet(metadata=q.metadata(fields), last=True).SerializeToString()

    def _receive_args(
        self, req: Any, call: st.QueueCall, queue: s.QueueSchema, context: Any
    ) -> tuple[int, float, str]:
        """The call's ``max_batch_size``, its ``max_duration`` and how a short one is
        answered (``generous`` when it is not short); a call Spanner refuses is aborted."""
        try:
            self._check_mode(req.transaction, queue)
            batch, duration = receive_args(call.args)
            short = self._short_receive() if duration < SHORT_RECEIVE_SECONDS else "generous"
            if short == "refuse":
                raise q.QueueRefusal(
                    "INVALID_ARGUMENT",
                    SHORT_REFUSAL.format(queue=queue.name, value=call.args.get("max_duration")),
                )
        except q.QueueRefusal as refusal:
            status.abort(context, status.code(refusal.code), str(refusal))
        return batch, duration, short

    def _batch(
        self, claimed: q.Claimed, call: st.QueueCall, batches: int, *, metadata: bool
    ) -> Any:
        """The ``PartialResultSet`` of one claimed batch (the call's ``batches``-th), with
        the result's metadata when it is the first."""
        fields, rows = q.project(claimed.fields, claimed.rows, call.columns)
        # A resume token on every batch: Google's client (Snapshot.execute_sql) holds rows
        # back until one arrives. Resuming with it starts a new RECEIVE: rows already sent
        # stay leased to this call.
        partial = b.PartialResultSet()
        if self._resume_tokens():
            partial.resume_token = f"receive-{batches}".encode()
        if metadata:
            partial.metadata.CopyFrom(q.metadata(fields))
        for row in rows:
            partial.values.extend(row)
        return partial

    def _idle(
        self,
        earliest: datetime | None,
        deadline: float,
        generation: int,
        database: str,
        queue: s.QueueSchema,
        mark: tuple[int, int],
        done: threading.Event,
    ) -> None:
        """Nothing claimed: wait for a send to the queue since ``mark`` (taken before the
        look), the next due message (``earliest``) or the next poll, within the call's
        ``deadline``; an ended call or generation ends the wait."""
        wait = min(IDLE_POLL_SECONDS, max(deadline - time.monotonic(), 0))
        if earliest is not None:
            wait = min(wait, max((earliest - q.now()).total_seconds(), 0.001))
        with self._commits:
            self._commits.wait_for(
                lambda: (
                    generation != self._generation
                    or done.is_set()
                    or self.stopping.is_set()
                    or self._mark(database, queue) != mark
                ),
                wait,
            )

    def _unclaim(self, database: str, queue: s.QueueSchema, claimed: q.Claimed) -> None:
        try:
            unclaim(self.backend, database, queue, claimed)
        except Exception:  # (they come back after their lease)
            logger.warning("giving back an unsent batch of %s failed", queue.name, exc_info=True)
        else:
            self.committed(database, [queue.name])  # due again: other streams may take them

    def _check_mode(self, selector: Any, queue: s.QueueSchema) -> None:
        kind = selector.WhichOneof("selector")
        if kind == "single_use" and is_strong_read(selector.single_use):
            return
        if kind == "id":
            with self._lock:
                if selector.id in self._strong_reads:
                    return
        if kind is None:  # no selector: a strong single-use read by default
            return
        raise q.QueueRefusal(
            "INVALID_ARGUMENT",
            f"RECEIVE_{queue.name} must run in a strong read-only transaction; stale reads "
            "and read-write transactions are not supported",
        )


def is_strong_read(options: Any) -> bool:
    """Whether ``TransactionOptions`` ask for a strong read-only transaction."""
    if options.WhichOneof("mode") != "read_only":
        return False
    bound = options.read_only.WhichOneof("timestamp_bound")
    return bound in (None, "strong")


def unclaim(backend: b.Backend, database: str, queue: s.QueueSchema, claimed: q.Claimed) -> None:
    """Give back the rows of ``claimed`` that still hold the lease it gave them (never sent):
    due now, no lease, the attempt not counted (a ``DeliverTime`` the lease moved later,
    ``queues.DELIVER_TIME_MODES``: now)."""
    n = len(queue.keys)
    token_at = [name for name, _ in claimed.fields].index(q.RECEIVE_SYSTEM[1])
    tokens = {row[token_at].string_value: row[:n] for row in claimed.rows}
    columns = [*queue.keys, s.LEASE_TOKEN, s.ATTEMPTS, s.DELIVER_TIME]

    def work(session: str, txn: b.Txn) -> tuple[None, list[Any]]:
        result = backend.read(
            session,
            queue.name,
            columns,
            [b.ListValue(values=list(k)) for k in tokens.values()],
            transaction_id=txn,
        )
        updates = []
        for row in b.rows(result):
            if not row[n].HasField("string_value") or row[n].string_value not in tokens:
                continue  # acked, or leased anew since: not ours to give back
            attempts = max(int(row[n + 1].string_value or 1) - 1, 0)
            at = q.now()
            deliver = min(q.parse_ts(row[n + 2].string_value), at)
            updates.append(
                [
                    *row[:n],
                    b.Value(string_value=q.ts(at)),
                    b.string_value(None),
                    b.string_value(None),
                    b.Value(string_value=str(attempts)),
                    b.Value(string_value=q.ts(deliver)),
                ]
            )
        mutations = []
        if updates:
            mutations.append(
                b.update_mutation(
                    queue.name,
                    [
                        *queue.keys,
                        s.NEXT_DELIVERY,
                        s.LEASE_TOKEN,
                        s.LEASE_EXPIRES,
                        s.ATTEMPTS,
                        s.DELIVER_TIME,
                    ],
                    updates,
                )
            )
        return None, mutations

    backend.run_in_transaction(database, work)


def receive_args(args: dict[str, Any]) -> tuple[int, float]:
    """(max_batch_size, max_duration in seconds) of a RECEIVE call, defaults applied."""
    batch = args.get("max_batch_size")
    if batch is None:
        batch = DEFAULT_MAX_BATCH_SIZE
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise q.QueueRefusal("INVALID_ARGUMENT", f"max_batch_size must be >= 1, not {batch!r}")
    raw = args.get("max_duration")
    try:
        duration = DEFAULT_MAX_DURATION if raw is None else parse_duration(raw)
    except ValueError as exc:
        raise q.QueueRefusal("INVALID_ARGUMENT", str(exc)) from None
    except OverflowError:  # more than a timedelta holds (about 2.7 million years)
        raise q.QueueRefusal("INVALID_ARGUMENT", f"max_duration {raw!r} is too long") from None
    return batch, duration.total_seconds()


def receive_fields(
    backend: b.Backend, database: str, queue: s.QueueSchema
) -> list[tuple[str, Any]]:
    """RECEIVE's columns when no row came (the metadata still names and types them)."""
    keys = ", ".join(q.quote(k) for k in queue.keys)
    with backend.session(database) as session:
        result = backend.query(
            session,
            f"SELECT {keys}, {s.PAYLOAD}, {s.DELIVER_TIME} FROM {q.quote(queue.name)} LIMIT 0",
        )
    fields = [(f.name, f.type_) for f in result.metadata.row_type.fields]
    return [
        *fields,
        (q.RECEIVE_SYSTEM[0], b.field_type(b.TypeCode.TIMESTAMP)),
        (q.RECEIVE_SYSTEM[1], b.field_type(b.TypeCode.STRING)),
        (q.RECEIVE_SYSTEM[2], b.field_type(b.TypeCode.BOOL)),
    ]

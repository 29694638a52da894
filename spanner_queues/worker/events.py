"""What the worker tells its listeners: ``WorkerEvent`` (one per thing it did, from
``Reporter.emit``), ``WorkerStats`` (counters), ``Reporter`` (the handle the worker's parts
report through: events, counters, log fields), ``WorkerEvents`` (a listener that records them
and lets tests wait), and ``log_extra`` (the fields of its log records).

A listener is any callable taking a ``WorkerEvent``; one that raises is logged and the worker
goes on. Event names are stable: ``worker_started``, ``received``, ``started``, ``acked``,
``failed``, ``retried``, ``released``, ``dead_lettered``, ``discarded``, ``lease_lost``,
``already_acked``, ``returned``, ``unmatched``, ``crashed``, ``cancelled`` (the receiver
stopped on a cancel: acked, not retried), ``cancel_requested`` (the worker told a running
receiver of a cancel), ``timed_out``, ``renewed``,
``renewal_failed``, ``idle``, ``stopping``, ``summary``, ``stopped``, and per queue (``queue``
set) ``receive_failed`` (each failed receive of a queue), ``queue_recovered`` (its first
receive that succeeded after) and ``committed`` (a run's transaction committed, ``size``
messages acked in it: a group's under group commit).

Log records: every record of ``spanner_queues.worker`` about one message carries the same
``extra`` fields (``log_extra``): ``action`` (what happened: the event name, or ``stuck``,
``dead_letter_clash``, ...), ``queue``, ``message_key``, ``attempt``, ``worker_id`` and
``duration`` (seconds the receiver ran, rounded to the millisecond; None where it did not run).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spanner_queues import instrumentation
from spanner_queues.message import Message

logger = logging.getLogger("spanner_queues.worker")

#: events after which a message has left the worker's hands
FINAL_EVENTS = frozenset(
    {
        "acked",
        "failed",
        "retried",
        "dead_lettered",
        "discarded",
        "lease_lost",
        "already_acked",
        "returned",
        "unmatched",
        "crashed",
        "cancelled",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerEvent:
    """Something the worker did. ``message`` is set for per-message events."""

    name: str
    worker_id: str
    message: Message | None = None
    receiver: str | None = None
    duration: float | None = None
    error: BaseException | None = None
    stats: WorkerStats | None = None
    #: a ``failed`` run whose receiver acked the message itself (``AckedFailure``)
    acked: bool = False
    #: the queue (label) of a per-queue event (``receive_failed``, ``queue_recovered``,
    #: ``committed``)
    queue: str | None = None
    #: ``committed``: the messages acked in that commit (a group's, a batch's, or 1)
    size: int | None = None


@dataclass(slots=True)
class WorkerStats:
    """Counters since the worker started (a snapshot when carried by an event)."""

    received: int = 0
    processed: int = 0
    failed: int = 0
    retried: int = 0
    dead_lettered: int = 0
    discarded: int = 0
    lease_lost: int = 0
    already_acked: int = 0
    #: prefetched messages given back unstarted at stop
    returned: int = 0
    #: deliveries whose receiver ran past its time limit (also counted in ``failed``)
    timed_out: int = 0
    #: deliveries no receiver of this worker matched, given back without spending an attempt
    unmatched: int = 0
    #: deliveries of an ordered queue given back because an earlier message of their key
    #: was still there (native queues: ``ordering.heads``), without spending an attempt
    waiting_in_order: int = 0
    #: runs that stopped on an operator's cancel (``api.cancel``): acked, not retried
    cancelled: int = 0
    #: receives that raised (any queue; ``Worker.queue_health`` says which are failing now)
    receive_errors: int = 0
    #: transactions committed by runs: one per receiver run, one per group (a failure's own
    #: bookkeeping not counted)
    commits: int = 0
    #: groups committed (``worker.group``) and the messages run in them
    groups: int = 0
    grouped: int = 0
    started: float = field(default_factory=time.monotonic)

    def copy(self) -> WorkerStats:
        return WorkerStats(**{name: getattr(self, name) for name in self.__slots__})


class Reporter:
    """How the worker's parts report (events to the listeners, counters, log fields): the
    only handle they hold for it. Thread-safe; a listener that raises is logged."""

    def __init__(
        self,
        worker_id: str,
        listeners: Sequence[Callable[[WorkerEvent], None]] = (),
        *,
        noted: Callable[[str, Message], None] | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.listeners = list(listeners)
        #: counters since the worker started (live; ``copy()`` for a snapshot)
        self.stats = WorkerStats()
        self._lock = threading.Lock()
        #: told of every per-message event before the listeners (the burst's unmatched keys)
        self._noted = noted

    def emit(self, name: str, **info: Any) -> None:
        """Call the listeners with a ``WorkerEvent``; one that raises is logged."""
        noted, message = self._noted, info.get("message")
        if noted is not None and message is not None:
            noted(name, message)
        if not self.listeners:
            return
        event = WorkerEvent(name=name, worker_id=self.worker_id, **info)
        for listener in self.listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("worker event listener failed on %s", name)

    def count(self, name: str, n: int = 1) -> None:
        """Add ``n`` to the counter ``name`` of ``stats``."""
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    def log_extra(
        self, action: str, message: Message, duration: float | None = None, **more: Any
    ) -> dict[str, Any]:
        """``log_extra`` with this worker's id."""
        return log_extra(action, message, worker_id=self.worker_id, duration=duration, **more)


class WorkerEvents:
    """A listener that records events and lets tests wait for them (no sleeps)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.counts: Counter[str] = Counter()
        self.history: list[WorkerEvent] = []

    def __call__(self, event: WorkerEvent) -> None:
        with self._cond:
            self.counts[event.name] += 1
            self.history.append(event)
            self._cond.notify_all()

    def wait_for(self, name: str, count: int = 1, timeout: float = 30.0) -> bool:
        """Block until ``name`` happened ``count`` times; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.counts[name] >= count, timeout)

    def messages(self, name: str) -> list[Message]:
        with self._cond:
            return [e.message for e in self.history if e.name == name and e.message]


#: the fields ``log_extra`` sets on every per-message record
LOG_FIELDS = ("action", "queue", "message_key", "attempt", "worker_id", "duration")


def log_extra(
    action: str,
    message: Message,
    *,
    worker_id: str | None = None,
    duration: float | None = None,
    **more: Any,
) -> dict[str, Any]:
    """The structured ``extra`` of a per-message log record: ``LOG_FIELDS`` (``duration`` in
    seconds, rounded to the millisecond; None where no receiver ran), then ``more`` (and the
    installed instrumentation's fields: the tracing app's ``trace_id``, ``span_id``)."""
    extra = {
        "action": action,
        "queue": message.queue,
        "message_key": message.key,
        "attempt": message.attempt,
        "worker_id": worker_id,
        "duration": None if duration is None else round(duration, 3),
        **more,
    }
    tracing = instrumentation.installed
    if tracing is not None:
        extra.update(tracing.log_fields(message))
    return extra


@dataclass(frozen=True, slots=True)
class Report:
    """How *apply* reports one delivery's settlement: a log record at ``level`` with ``text``
    (``%(name)s`` fields: ``message``, ``attempt``, ``receiver``, ``error``, ``error_type``,
    ``after``, ``reason``, ``queue``, ``key``, ``parked``, ``size``, ``miss``), the counter of
    ``WorkerStats`` it adds one to (None: none) and the event it emits (None: none)."""

    level: int
    text: str
    counter: str | None
    event: str | None
    #: the log record carries the error's traceback
    traceback: bool = False


#: the report of each outcome's kind and settlement, by name (``Settlement.report``)
REPORTS: dict[str, Report] = {
    "acked": Report(logging.DEBUG, "%(message)s attempt %(attempt)d acked (%(receiver)s)",
                    "processed", "acked"),
    "retried": Report(logging.INFO, "%(message)s attempt %(attempt)d: retry after "
                      "%(after)s%(reason)s", "retried", "retried"),
    "failed": Report(logging.ERROR, "%(message)s attempt %(attempt)d failed in %(receiver)s: "
                     "%(error_type)s: %(error)s", "failed", "failed", traceback=True),
    "lease_lost": Report(logging.WARNING, "%(message)s attempt %(attempt)d: lease lost; not acked "
                         "(it will be delivered again)", "lease_lost", "lease_lost"),
    "already_acked": Report(logging.WARNING, "%(message)s: already acked by someone else (its "
                            "lease had expired); this delivery's transaction was rolled back",
                            "already_acked", "already_acked"),
    "unmatched": Report(logging.WARNING, "%(message)s: no receiver of this worker matches "
                        "%(miss)s: a deployment mismatch? (a receiver of another release, not "
                        "deployed on this worker); given back without spending an attempt, due "
                        "after its back-off, for a worker that has it. Logged once per queue and "
                        "kind.", "unmatched", "unmatched"),
    "released": Report(logging.DEBUG, "%(message)s attempt %(attempt)d: given back",
                       None, "released"),
    "dead_lettered": Report(logging.ERROR, "%(message)s: %(attempt)d attempts, moved to "
                            "dead-letter queue %(queue)s", "dead_lettered", "dead_lettered"),
    "discarded": Report(logging.ERROR, "%(message)s: %(attempt)d attempts, discarded "
                        "(discard_after_max_attempts); payload of %(size)d bytes",
                        "discarded", "discarded"),
    "dead_letter_clash": Report(logging.ERROR, "%(message)s: %(attempt)d attempts, but "
                                "dead-letter queue %(queue)s already holds key %(key)r; parked "
                                "in its queue (due %(parked)s): resolve the clash in the admin, "
                                "then deliver it now", None, None),
    "cancelled": Report(logging.WARNING, "%(message)s attempt %(attempt)d: %(receiver)s stopped, "
                        "%(error)s; acked, not retried", "cancelled", "cancelled"),
    "returned": Report(logging.DEBUG, "%(message)s: prefetched, not started; given back at stop",
                       "returned", "returned"),
}  # fmt: skip

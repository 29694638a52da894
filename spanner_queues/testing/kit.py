"""Helpers for testing your own queues, receivers and tasks (pytest or ``TestCase``).

- ``sent(queue)`` / ``assert_sent(queue, **match)``: the messages in a queue, read on the
  test's connection, so a ``TestCase`` (one transaction per test) sees what it sent on the
  table engine before anything commits.
- ``drain(queue)``: receive the queue's due messages one by one and run its registered
  receivers in the test's thread, on the test's connection; each outcome (``acked``,
  ``retried``, ``failed``, ``unmatched``, ``exhausted``) is settled by the worker's own
  *decide* and *apply* stations, so a test sees what the worker does: ``Retry`` requeues, a
  failure is counted and given back after its back-off, or dead-lettered or discarded past
  ``max_attempts``, an unmatched message is given back without spending an attempt.
- ``moved_clock()``: a clock you move forward (``advance``), installed in
  ``spanner_queues.clock`` for the block (every thread): deliver times, leases and back-off are
  decided by it. Only engines that read time from Python can follow it (the table engine, on
  any database): ``clock_is_movable(queue)`` says whether this one can; native Spanner queues
  use Spanner's commit timestamps, and ``moved_clock`` raises ``ClockNotMovable`` there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from spanner_queues import api, clock
from spanner_queues.engines import engine_for, engines
from spanner_queues.exceptions import (
    PayloadError,
    QueueConfigurationError,
    QueueError,
)
from spanner_queues.keys import row_to_message
from spanner_queues.message import Message
from spanner_queues.options import queue_options
from spanner_queues.payload import encode_payload, payload_type
from spanner_queues.queues import get_queue
from spanner_queues.receivers import (
    MessageContext,
    NoReceiver,
    ReceiverRegistry,
    call,
    receivers,
    running,
)
from spanner_queues.storage import rows
from spanner_queues.transactions import run_in_transaction
from spanner_queues.worker.apply import DeliveryPolicy, Outcomes
from spanner_queues.worker.decide import over_limit
from spanner_queues.worker.events import Reporter
from spanner_queues.worker.leases import Leases
from spanner_queues.worker.outcomes import Kind, Outcome, outcomes_of
from spanner_queues.worker.slots import Delivery, Plan

if TYPE_CHECKING:
    from spanner_queues.models import Queue

__all__ = [
    "ClockNotMovable",
    "Drained",
    "MovableClock",
    "Outcome",
    "assert_sent",
    "clock_is_movable",
    "drain",
    "moved_clock",
    "sent",
]

ACKED, RETRIED, FAILED = Kind.ACKED.value, Kind.RETRY.value, "failed"


class ClockNotMovable(QueueError):
    """The queue's engine takes time from the database (native Spanner queues)."""


# --- what was sent ---------------------------------------------------------------------------
def sent(queue: str | type[Queue], *, using: str | None = None) -> list[Message]:
    """The messages in ``queue`` now, due first (then by key), read on the test's connection
    (uncommitted sends of the current transaction included, on the table engine)."""
    model = get_queue(queue)
    db = using or engine_for(model).database
    found = [row_to_message(model, row) for row in rows(model, db)]
    return sorted(found, key=lambda m: (m.deliver_time or datetime.min, repr(m.key)))


def _matches(message: Message, match: Mapping[str, Any]) -> bool:
    key = message.key_dict
    payload: Any = None
    for name, wanted in match.items():
        if name == "payload":
            if message.payload != _payload_bytes(message, wanted):
                return False
        elif name in key:
            if key[name] != wanted:
                return False
        else:
            if payload is None:
                try:
                    payload = message.json()
                except PayloadError:
                    return False
            if not isinstance(payload, Mapping) or payload.get(name, _MISSING) != wanted:
                return False
    return True


_MISSING = object()


def _payload_bytes(message: Message, wanted: Any) -> bytes:
    model = get_queue(message.queue)
    return encode_payload(wanted, payload_type=payload_type(model), max_bytes=None)


def assert_sent(
    queue: str | type[Queue],
    count: int | None = None,
    *,
    using: str | None = None,
    **match: Any,
) -> list[Message]:
    """The messages of ``queue`` matching ``match`` (key fields, top-level fields of a JSON
    payload, or ``payload=`` the whole payload); ``AssertionError`` listing what the queue
    holds when there are none (or not ``count`` of them)."""
    everything = sent(queue, using=using)
    found = [m for m in everything if _matches(m, match)]
    if (count is None and not found) or (count is not None and len(found) != count):
        listing = "\n".join(f"  {m}: {m.payload[:200]!r}" for m in everything) or "  (empty)"
        wanted = "some" if count is None else str(count)
        raise AssertionError(
            f"expected {wanted} message(s) in {get_queue(queue)._meta.label} matching "
            f"{match!r}, found {len(found)}; the queue holds:\n{listing}"
        )
    return found


# --- running receivers -----------------------------------------------------------------------
class Drained(list):
    """The outcomes of a ``drain`` (the worker's ``Outcome``: ``message``, ``outcome``,
    ``receiver``, ``error``, ``kind``), in the order the messages ran."""

    def _of(self, outcome: str) -> list[Outcome]:
        return [o for o in self if o.outcome == outcome]

    @property
    def acked(self) -> list[Outcome]:
        return self._of(ACKED)

    @property
    def retried(self) -> list[Outcome]:
        return self._of(RETRIED)

    @property
    def failed(self) -> list[Outcome]:
        return self._of(FAILED)

    @property
    def unmatched(self) -> list[Outcome]:
        """Messages no receiver matched: given back without spending an attempt."""
        return self._of(Kind.UNMATCHED.value)

    @property
    def exhausted(self) -> list[Outcome]:
        """Messages delivered more often than ``max_attempts`` allows: not run, given up on."""
        return self._of(Kind.EXHAUSTED.value)


def drain(
    queue: str | type[Queue],
    *,
    registry: ReceiverRegistry | None = None,
    max_messages: int = 100,
    expect: int | None = None,
    timeout: float = 60.0,
) -> Drained:
    """Run the receivers of ``queue`` on its due messages until none is due (at most
    ``max_messages``); with ``expect=n`` wait up to ``timeout`` seconds for ``n`` messages
    (engines that stream, like native queues, hand due messages over a moment later).

    Each message is settled as the worker settles it, by the worker's own *decide* and *apply*
    (``worker.decide``, ``worker.apply``): ``Retry`` requeues it, a failure is counted and
    given back after its back-off, or dead-lettered or discarded past ``max_attempts``; a
    message no receiver matches is given back without spending an attempt.

    Inside a test's transaction (``TestCase``, ``django_db``) each message runs in a savepoint;
    Spanner has none, so there a failing receiver marks the test's transaction for rollback:
    drain failures on Spanner in ``transaction=True`` tests."""
    model = get_queue(queue)
    registry = registry if registry is not None else receivers
    specs = registry.for_queue(model)
    if not specs:
        raise QueueConfigurationError(f"{model._meta.label} has no receiver to drain it with.")
    engine = engine_for(model)
    plan = Plan(
        model,
        tuple(specs),
        batch=False,
        batch_size=1,
        db=engine.database,
        engine=engine,
        options=queue_options(model),
        policy=DeliveryPolicy(engine),
    )
    settle = Outcomes(Reporter("drain"), Leases()).settle
    out = Drained()
    deadline = time.monotonic() + timeout
    while len(out) < max_messages:
        got = api.receive(model, max_messages=1)
        if not got:
            if expect is not None and len(out) < expect and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            break
        outcome = _run(plan, Delivery(got[0], plan, renew_at=None), registry)
        settle([outcome])
        out.append(outcome)
    return out


def _run(plan: Plan, delivery: Delivery, registry: ReceiverRegistry) -> Outcome:
    """*run*, in the test's thread: the delivery's ``Outcome`` (as the worker's ``_route`` and
    ``_run`` make it: exhausted, unmatched, acked, or ``outcomes_of`` the error)."""
    message, db, retries = delivery.message, plan.db, plan.retries
    if over_limit(plan.options, message.attempt):
        return Outcome(Kind.EXHAUSTED, delivery)
    try:
        spec = registry.route(list(plan.specs), message)
    except NoReceiver as exc:
        return Outcome(Kind.UNMATCHED, delivery, error=exc)
    context = MessageContext(spec, [message])

    def ack_unless_done() -> None:
        if not context.acked(message):
            plan.policy.ack(plan.model, [message], using=db)

    def body() -> None:
        context._restart()  # (again on a retried transaction: its acks rolled back)
        call(spec, context)
        if spec.atomic:
            ack_unless_done()

    started = time.monotonic()
    try:
        with running(context):
            if spec.atomic:
                run_in_transaction(body, using=db, retries=retries)
            else:
                body()
                run_in_transaction(ack_unless_done, using=db, retries=retries)
    except Exception as exc:
        took = time.monotonic() - started
        return outcomes_of(exc, [delivery], spec.name, took, atomic=spec.atomic)[0]
    return Outcome(Kind.ACKED, delivery, spec.name, time.monotonic() - started)


# --- time ------------------------------------------------------------------------------------
def clock_is_movable(queue: str | type[Queue] | None = None) -> bool:
    """Whether ``moved_clock`` moves the time of ``queue``'s engine (of the default engine when
    None): engines that read time from Python can; native Spanner queues cannot."""
    if queue is None:
        engine = engines["default"]
    else:
        engine = engine_for(get_queue(queue))
    return not engine.features.supports_native_queues


class MovableClock:
    """The time spanner_queues reads while ``moved_clock`` is active: the clock below it (real
    time, or an enclosing ``moved_clock``) plus ``offset``, which only grows. ``now()`` is safe
    to call from any thread."""

    def __init__(self, below: clock.Source | None = None) -> None:
        self.offset = timedelta(0)
        self._below = below
        self._lock = threading.Lock()

    def now(self) -> datetime:
        below = self._below
        return (below() if below is not None else timezone.now()) + self.offset

    def advance(self, delta: timedelta) -> datetime:
        """Move the clock forward by ``delta``; return the new now."""
        if delta < timedelta(0):
            raise ValueError("the clock only moves forward")
        with self._lock:
            self.offset += delta
        return self.now()


@contextmanager
def moved_clock(queue: str | type[Queue] | None = None) -> Iterator[MovableClock]:
    """Install a clock you move forward with ``advance()`` as ``spanner_queues.clock`` for the
    block: everything spanner_queues decides from the time (deliver times, ``delay=``, leases,
    back-off) reads it, in every thread of the process (a worker started in the block
    included); your own code follows it by calling ``spanner_queues.clock.now()`` (Django's
    ``timezone.now()`` keeps the real time). Blocks nest: an inner clock starts from the outer
    one's time. ``ClockNotMovable`` where the engine takes time from the database."""
    if not clock_is_movable(queue):
        raise ClockNotMovable(
            "This queue's engine takes time from Spanner's commit timestamps (native queues); "
            "its deliver times and leases cannot be moved from Python."
        )
    moved = MovableClock(clock.installed())
    source = moved.now
    clock.install(source)
    try:
        yield moved
    finally:
        clock.uninstall(source)

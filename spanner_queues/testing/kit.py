"""Helpers for testing your own queues, receivers and tasks (pytest or ``TestCase``).

- ``sent(queue)`` / ``assert_sent(queue, **match)``: the messages in a queue, read on the
  test's connection, so a ``TestCase`` (one transaction per test) sees what it sent on the
  table engine before anything commits.
- ``drain(queue)``: receive the queue's due messages one by one and run its registered
  receivers in the test's thread, on the test's connection, as the worker does for the ack,
  ``Retry`` and failures; returns each message's outcome (``acked``, ``retried``, ``failed``).
  A failure is released with the engine's back-off (recorded in the failure ledger where the
  engine keeps one); dead-lettering after ``max_attempts`` is the worker's and is not done here.
- ``moved_clock()``: a clock for spanner_queues that you move forward (``advance``): deliver
  times, leases and back-off are decided by it. Only engines that read time from Python can
  follow it (the table engine, on any database): ``clock_is_movable(queue)`` says whether
  this one can; native Spanner queues use Spanner's commit timestamps, and ``moved_clock``
  raises ``ClockNotMovable`` there.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from spanner_queues import api
from spanner_queues.exceptions import PayloadError, QueueConfigurationError, QueueError, Retry
from spanner_queues.keys import row_to_message
from spanner_queues.message import Message
from spanner_queues.models import rows
from spanner_queues.receivers import (
    NoReceiver,
    ReceiverRegistry,
    acked_by_receiver,
    receivers,
    set_pending,
)
from spanner_queues.registry import engine_for, get_queue
from spanner_queues.transactions import run_in_transaction

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

ACKED, RETRIED, FAILED = "acked", "retried", "failed"


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
    from spanner_queues.payload import encode_payload, payload_type

    model = get_queue(message.queue)
    return encode_payload(wanted, payload_type=payload_type(model), max_bytes=None)


def assert_sent(
    queue: str | type[Queue], count: int | None = None, *, using: str | None = None,
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
@dataclass(frozen=True, slots=True)
class Outcome:
    """What running one message did: ``outcome`` is ``"acked"``, ``"retried"`` or
    ``"failed"``; ``error`` is the exception of a retry or failure."""

    message: Message
    outcome: str
    receiver: str | None
    error: BaseException | None = None


class Drained(list):
    """The outcomes of a ``drain``, in the order the messages ran."""

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

    Inside a test's transaction (``TestCase``, ``django_db``) each message runs in a savepoint;
    Spanner has none, so there a failing receiver marks the test's transaction for rollback:
    drain failures on Spanner in ``transaction=True`` tests."""
    model = get_queue(queue)
    specs = (registry if registry is not None else receivers).for_queue(model)
    if not specs:
        raise QueueConfigurationError(f"{model._meta.label} has no receiver to drain it with.")
    out = Drained()
    deadline = time.monotonic() + timeout
    while len(out) < max_messages:
        got = api.receive(model, max_messages=1)
        if not got:
            if expect is not None and len(out) < expect and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            break
        out.append(_run(model, specs, got[0], registry or receivers))
    return out


def _run(model: type[Queue], specs: list[Any], message: Message, registry: Any) -> Outcome:
    engine = engine_for(model)
    db = engine.database
    retries = engine.params.transaction_retries
    spec = None

    def ack_unless_done() -> None:
        if not acked_by_receiver(message):
            api.ack(message, using=db)

    try:
        spec = registry.route(specs, message)

        def body() -> None:
            set_pending([message])
            spec.func([message] if spec.batch else message)
            if spec.atomic:
                ack_unless_done()

        try:
            if spec.atomic:
                run_in_transaction(body, using=db, retries=retries)
            else:
                body()
                run_in_transaction(ack_unless_done, using=db, retries=retries)
        finally:
            set_pending(None)
    except Retry as exc:
        due = timezone.now() + (exc.after if exc.after is not None else _backoff(message, engine))

        def move() -> None:
            api.ack(message, using=db)
            api.send(model, using=db, payload=message.payload, deliver_time=due,
                     **message.key_dict)

        run_in_transaction(move, using=db, retries=retries)
        return Outcome(message, RETRIED, spec.name if spec else None, exc)
    except (Exception, NoReceiver) as exc:
        error = exc
        run_in_transaction(
            lambda: engine.record_failure(model, message, error, using=db), using=db,
            retries=retries,
        )
        if engine.features.supports_release:
            api.release(message, deliver_time=timezone.now() + _backoff(message, engine))
        return Outcome(message, FAILED, spec.name if spec else None, error)
    return Outcome(message, ACKED, spec.name)


def _backoff(message: Message, engine: Any) -> timedelta:
    now = timezone.now()
    return engine.params.backoff.delay(max(message.attempt, 1), now - (message.send_time or now))


# --- time ------------------------------------------------------------------------------------
def clock_is_movable(queue: str | type[Queue] | None = None) -> bool:
    """Whether ``moved_clock`` moves the time of ``queue``'s engine (of the default engine when
    None): engines that read time from Python can; native Spanner queues cannot."""
    if queue is None:
        from spanner_queues.engines import engines

        engine = engines["default"]
    else:
        engine = engine_for(get_queue(queue))
    return not engine.features.supports_native_queues


class MovableClock:
    """The time spanner_queues reads while ``moved_clock`` is active: real time plus
    ``offset``, which only grows."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return _real_now() + self.offset

    def advance(self, delta: timedelta) -> datetime:
        """Move the clock forward by ``delta``; return the new now."""
        if delta < timedelta(0):
            raise ValueError("the clock only moves forward")
        self.offset += delta
        return self.now()


_real_now = timezone.now


class _Timezone:
    """``django.utils.timezone`` with the movable clock's ``now``."""

    def __init__(self, clock: MovableClock) -> None:
        self._clock = clock

    def now(self) -> datetime:
        return self._clock.now()

    def __getattr__(self, name: str) -> Any:
        return getattr(sys.modules["django.utils.timezone"], name)


def _import_time_readers() -> None:
    """Import what reads the time lazily (the engines, the worker) so that it is patched."""
    import importlib
    import pkgutil

    from django.conf import settings

    from spanner_queues.engines import engines

    for alias in getattr(settings, "SPANNER_QUEUES", None) or {"default": {}}:
        engines[alias]
    worker = importlib.import_module("spanner_queues.worker")
    for info in pkgutil.walk_packages(getattr(worker, "__path__", []), "spanner_queues.worker."):
        importlib.import_module(info.name)


@contextmanager
def moved_clock(queue: str | type[Queue] | None = None) -> Iterator[MovableClock]:
    """Give spanner_queues a clock you move forward with ``advance()``: every module of the
    package that reads ``django.utils.timezone`` reads it for the block (your own code and
    Django do not). ``ClockNotMovable`` where the engine takes time from the database."""
    if not clock_is_movable(queue):
        raise ClockNotMovable(
            "This queue's engine takes time from Spanner's commit timestamps (native queues); "
            "its deliver times and leases cannot be moved from Python."
        )
    _import_time_readers()
    clock = MovableClock()
    shim = _Timezone(clock)
    real = sys.modules["django.utils.timezone"]  # (this module's own name is patched too)
    patched = []
    for name, module in list(sys.modules.items()):
        if (name == "spanner_queues" or name.startswith("spanner_queues.")) and getattr(
            module, "timezone", None
        ) is real:
            module.timezone = shim  # type: ignore[attr-defined]
            patched.append(module)
    try:
        yield clock
    finally:
        for module in patched:
            module.timezone = real  # type: ignore[attr-defined]

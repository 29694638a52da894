"""Conformance: ``testing.drain()`` settles a message as the worker does (issue 41), because both
run the worker's own *decide* and *apply* stations. One message of each case is settled by
``drain()``, another alike by a ``Worker``; the queue then holds the same for both: where the
message is (its queue, its dead-letter queue), whether it is due now, its attempt count.

Cases: a message no receiver matches (given back unspent, due after its back-off), ``Retry``
(requeued under its key), a message past ``max_attempts`` (not run: dead-lettered), a failure
on its last attempt (dead-lettered)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connections

from spanner_queues import api, clock
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import Retry
from spanner_queues.message import Message
from spanner_queues.receivers import ReceiverRegistry
from spanner_queues.receivers import receiver as register_receiver
from spanner_queues.testing.conformance.models import Emails, EmailsDead
from spanner_queues.testing.conformance.support import receive_due, wait_until
from spanner_queues.testing.kit import drain, sent
from spanner_queues.worker import Worker, WorkerEvents
from spanner_queues.worker.apply import DeliveryPolicy

pytestmark = pytest.mark.django_db(transaction=True)


def where(key: str, at: datetime) -> tuple[str, bool, int | None]:
    """Where message ``key`` is now: its queue's label, whether it was due at ``at`` (the
    moment it was settled: a short back-off may have run out by the time a worker has
    stopped), its attempt."""
    for queue in (Emails, EmailsDead):
        for m in sent(queue):
            if m.key_dict["id"] == key:
                due = m.deliver_time is None or m.deliver_time <= at
                return queue._meta.label, due, m.attempt
    return "(gone)", False, None


def spend(key: str, failures: int) -> None:
    """Deliver ``key`` ``failures`` times, each a failed run counted in the failure ledger,
    and give it back due now (or, where the engine cannot release, after a 1 s lease)."""
    engine = engine_for(Emails)
    policy = DeliveryPolicy(engine)
    for _ in range(failures):
        mine: list[Message] = []

        def delivered(mine: list[Message] = mine) -> bool:
            got = receive_due(Emails, lease=timedelta(seconds=1))
            mine.extend(m for m in got if m.key_dict["id"] == key)
            return bool(mine)

        wait_until(delivered, timeout=60)
        m = mine[0]
        policy.fail(Emails, m, RuntimeError("spent"), using=engine.database)
        if engine.features.supports_release:
            api.release(m, deliver_time=clock.now())


def settle_both(
    receiver: Callable[[Message], Any],
    event: str,
    *,
    failures: int = 0,
    payload: Any = None,
    match: dict[str, Any] | None = None,
) -> tuple[tuple[str, bool, int | None], tuple[str, bool, int | None]]:
    """Settle one message with ``drain()`` and one alike with a worker (after ``failures``
    counted failed runs each); return where each is then."""
    registry = ReceiverRegistry()
    register_receiver(Emails, registry=registry, match=match)(receiver)
    keys: list[str] = []
    try:
        return _settle_both(registry, event, failures, payload, keys)
    finally:  # (native queues outlive the test's flush: leave nothing due for the next test)
        for key in keys:
            for queue in (Emails, EmailsDead):
                queue.objects.filter(pk=key).delete()


def _settle_both(
    registry: ReceiverRegistry, event: str, failures: int, payload: Any, keys: list[str]
) -> tuple[tuple[str, bool, int | None], tuple[str, bool, int | None]]:
    by_drain = Emails.send(payload=payload or {}).key_dict["id"]
    keys.append(by_drain)
    spend(by_drain, failures)
    drained = drain(Emails, registry=registry, max_messages=1, expect=1)
    assert [m.key_dict["id"] for m in (o.message for o in drained)] == [by_drain]
    after_drain = where(by_drain, clock.now())

    by_worker = Emails.send(payload=payload or {}).key_dict["id"]
    keys.append(by_worker)
    spend(by_worker, failures)
    events = WorkerEvents()
    worker = Worker([Emails], registry=registry, listeners=[events], install_signal_handlers=False)

    def run() -> None:
        worker.run()
        connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    settled: list[datetime] = []

    def seen() -> bool:
        if by_worker in [m.key_dict["id"] for m in events.messages(event)]:
            settled.append(clock.now())
        return bool(settled)

    try:
        wait_until(seen, 90)
    finally:
        worker.stop()
        thread.join(60)
    return after_drain, where(by_worker, settled[0])


def test_drain_gives_back_an_unmatched_message_unspent_as_the_worker_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A back-off longer than any settle takes: the test settings' first one (0.1-0.2 s) can run
    # out between the settle and the look on a busy emulator, and the message read as due.
    monkeypatch.setattr(DeliveryPolicy, "backoff", lambda self, message: timedelta(minutes=10))
    drained, worked = settle_both(lambda m: None, "unmatched", match={"kind": "refund"})
    assert drained == worked
    assert drained[:2] == (Emails._meta.label, False)  # in its queue, due after its back-off


def test_drain_requeues_a_retried_message_as_the_worker_does() -> None:
    def retry(message: Message) -> None:
        raise Retry(after=timedelta(hours=1))

    drained, worked = settle_both(retry, "retried")
    assert drained == worked
    assert drained[:2] == (Emails._meta.label, False)


def test_drain_dead_letters_an_exhausted_message_as_the_worker_does() -> None:
    ran: list[int | None] = []
    drained, worked = settle_both(
        lambda m: ran.append(m.attempt),
        "dead_lettered",
        failures=3,  # max_attempts = 3
    )
    assert drained == worked and ran == []  # never run again
    assert drained[0] == EmailsDead._meta.label


def test_drain_dead_letters_a_failure_on_its_last_attempt_as_the_worker_does() -> None:
    def fail(message: Message) -> None:
        raise RuntimeError("fails on every attempt")

    drained, worked = settle_both(fail, "dead_lettered", failures=2)
    assert drained == worked
    assert drained[0] == EmailsDead._meta.label

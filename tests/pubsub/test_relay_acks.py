"""The relay's acks under a worker (issue 39): a run hands its confirmed messages over and
returns, the queue's next run publishes while they commit, and the worker's ``run()`` returns
only once they did; a failed ack loses nothing."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from spanner_queues.contrib.pubsub import relay as relay_module
from spanner_queues.contrib.pubsub.relay import register_relays
from spanner_queues.receivers import ReceiverRegistry
from spanner_queues.signals import messages_published
from spanner_queues.testing import clock_is_movable, moved_clock
from spanner_queues.worker import Worker
from tests.conftest import wait_until
from tests.pubsubapp.models import OrderedOrderEvents, OrderEvents

pytestmark = pytest.mark.django_db(transaction=True)


def relay_burst(runs_of: int | None = None) -> Any:
    """A burst of a relay worker; with ``runs_of``, relay runs of at most that many messages
    (``RELAY_BATCH_SIZE``)."""
    registry = None
    if runs_of is not None:
        registry = ReceiverRegistry()
        with override_settings(
            SPANNER_QUEUES_PUBSUB={**settings.SPANNER_QUEUES_PUBSUB, "RELAY_BATCH_SIZE": runs_of}
        ):
            register_relays(registry, [OrderEvents])
    return Worker(
        ["pubsubapp.OrderEvents"], burst=True, install_signal_handlers=False, registry=registry
    ).run()


def test_the_next_run_publishes_while_the_last_runs_ack_commits(pubsub, monkeypatch) -> None:
    """The first run's ack is held until the second run's messages are confirmed: with the ack
    in the run (before), the second run would never publish and the wait would time out."""
    for n in range(4):
        OrderEvents.send(order=n, message_id=f"m{n}", payload={"n": n})
    published: list[int] = []
    second_published = threading.Event()
    ack_threads: list[str] = []
    original = relay_module._AckJob.run

    def confirmed(sender: Any, messages: Any, **kwargs: Any) -> None:
        published.append(len(messages))
        if len(published) >= 2:
            second_published.set()

    def held_run(job: Any) -> None:
        ack_threads.append(threading.current_thread().name)
        if len(ack_threads) == 1:
            assert second_published.wait(30), "the next run did not publish before this ack"
        original(job)

    monkeypatch.setattr(relay_module._AckJob, "run", held_run)
    messages_published.connect(confirmed, dispatch_uid="test-relay-acks")
    try:
        stats = relay_burst(runs_of=2)
    finally:
        messages_published.disconnect(dispatch_uid="test-relay-acks")
    assert stats.processed == 4
    assert published == [2, 2]
    assert set(ack_threads) == {"sq-relay-acks"}
    assert not OrderEvents.objects.exists()  # run() returned after the acks committed
    assert len(pubsub.pull()) == 4


def test_a_workers_run_returns_only_after_the_acks_it_handed_over_commit(
    pubsub, monkeypatch
) -> None:
    OrderEvents.send(order=1, message_id="m1", payload={"n": 1})
    committed = threading.Event()
    original = relay_module._AckJob.run

    def slow_run(job: Any) -> None:
        threading.Event().wait(0.5)  # an ack slower than the rest of the worker's stop
        original(job)
        committed.set()

    monkeypatch.setattr(relay_module._AckJob, "run", slow_run)
    assert relay_burst().processed == 1
    assert committed.is_set()
    assert not OrderEvents.objects.exists()


def test_a_failed_ack_is_logged_and_the_message_published_again_under_its_event_id(
    pubsub, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An ack that fails after Pub/Sub confirmed (a lost lease, the database) loses nothing:
    the message stays, comes back when its lease ends and is published again, the copy under
    the same event id (what the inbox drops)."""
    OrderEvents.send(order=1, message_id="m1", payload={"n": 1})
    original = relay_module.api.ack_many
    failures = []

    def failing_once(*args: Any, **kwargs: Any) -> None:
        if not failures:
            failures.append(1)
            raise RuntimeError("the database went away")
        original(*args, **kwargs)

    monkeypatch.setattr(relay_module.api, "ack_many", failing_once)
    caplog.set_level(logging.WARNING, logger="spanner_queues.pubsub")
    relay_burst()
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "relay_ack_failed"]
    assert "published again when their leases end" in record.getMessage()
    assert OrderEvents.objects.count() == 1  # not acked, not lost
    if clock_is_movable(OrderEvents):
        with moved_clock() as clock:
            clock.advance(timedelta(seconds=60))  # past the lease: due again
            relay_burst()
    else:  # native queues: Spanner's lease ends
        wait_until(lambda: relay_burst() is not None and not OrderEvents.objects.exists(), 60)
    assert not OrderEvents.objects.exists()
    pulled = pubsub.pull()
    assert len(pulled) == 2
    assert len({m.attributes["event_id"] for m in pulled}) == 1


def test_the_ack_thread_stays_one_and_ends_idle_over_rounds_on_two_queues_with_a_key_reused(
    pubsub, monkeypatch
) -> None:
    """Time is an input: a worker relaying two queues in rounds, the same key sent again each
    round, has at most one ack thread, which ends once idle."""
    monkeypatch.setattr(relay_module, "ACKER_IDLE_SECONDS", 0.3)
    worker = Worker(
        ["pubsubapp.OrderEvents", "pubsubapp.OrderedOrderEvents"], install_signal_handlers=False
    )
    runner = threading.Thread(target=worker.run)
    runner.start()
    most = 0
    try:
        for n in range(20):
            OrderEvents.send(order=1, message_id="same", payload={"n": n})  # a key used again
            OrderedOrderEvents.send(order=n % 3, message_id=f"m{n}", payload={"n": n})
            wait_until(
                lambda: (
                    not OrderEvents.objects.exists() and not OrderedOrderEvents.objects.exists()
                ),
                30,
            )
            most = max(most, _ack_threads())
    finally:
        worker.stop()
        runner.join(30)
    assert not runner.is_alive()
    assert most == 1
    wait_until(lambda: _ack_threads() == 0, 10)
    assert len(pubsub.pull()) == 40


def _ack_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "sq-relay-acks")


def test_a_run_whose_queue_has_acks_stuck_acks_its_messages_itself_with_their_archive(
    pubsub, monkeypatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The acks handed over before are stuck (a database that does not answer): a run waits
    for its queue's place at most ``ACKS_WAIT_SECONDS`` (or to its time limit), then acks its
    own messages, archive rows included, instead of waiting for good."""
    from spanner_queues.contrib.pubsub.models import RelayedEvent

    monkeypatch.setattr(relay_module, "ACKS_AHEAD", 1)
    monkeypatch.setattr(relay_module, "ACKS_WAIT_SECONDS", 0.2)
    for n in range(2):
        OrderEvents.send(order=n, message_id=f"m{n}", payload={"n": n})
    release = threading.Event()
    original = relay_module._AckJob.run

    def stuck_run(job: Any) -> None:
        assert release.wait(30)
        original(job)

    monkeypatch.setattr(relay_module._AckJob, "run", stuck_run)
    caplog.set_level(logging.WARNING, logger="spanner_queues.pubsub")
    registry = ReceiverRegistry()
    with override_settings(
        SPANNER_QUEUES_PUBSUB={**settings.SPANNER_QUEUES_PUBSUB, "RELAY_BATCH_SIZE": 1}
    ):
        register_relays(registry, [OrderEvents])  # runs of one message
    worker = Worker(["pubsubapp.OrderEvents"], install_signal_handlers=False, registry=registry)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        # one run handed over and stuck; the next run (runs of one) acked its own
        wait_until(lambda: OrderEvents.objects.count() == 1, 30)
        assert RelayedEvent.objects.count() == 1
        [record] = [r for r in caplog.records if getattr(r, "action", None) == "relay_ack_waited"]
        assert "acks its 1 message(s) itself" in record.getMessage()
    finally:
        release.set()
        worker.stop()
        runner.join(30)
    assert not runner.is_alive()
    assert not OrderEvents.objects.exists()
    assert RelayedEvent.objects.count() == 2
    assert len(pubsub.pull()) == 2

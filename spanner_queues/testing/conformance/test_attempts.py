"""Conformance: ``message.attempt`` is the true delivery count on every engine and every queue
(one more per delivery), or None where the engine cannot know it; never a wrong number. A
queue without ``max_attempts`` counts too: a receiver that fails on its first attempt and
succeeds on its second ends acked."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from spanner_queues import api, clock
from spanner_queues.engines import engine_for
from spanner_queues.message import Message
from spanner_queues.options import queue_options
from spanner_queues.receivers import ReceiverRegistry
from spanner_queues.receivers import receiver as register_receiver
from spanner_queues.testing.conformance.models import Jobs
from spanner_queues.testing.conformance.support import wait_until
from spanner_queues.worker import Worker
from spanner_queues.worker.apply import DeliveryPolicy

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_receiver_failing_on_attempt_1_succeeds_on_attempt_2_and_the_message_is_acked() -> None:
    registry = ReceiverRegistry()
    attempts: list[int | None] = []
    done = threading.Event()

    def flaky(message: Message) -> None:
        attempts.append(message.attempt)
        if message.attempt == 1:
            raise RuntimeError("fails on its first attempt")
        done.set()

    register_receiver(Jobs, registry=registry)(flaky)
    sent = Jobs.send(payload="x")
    worker = Worker([Jobs], registry=registry, install_signal_handlers=False)

    def run() -> None:
        worker.run()
        connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        # Where the engine cannot release (native), the message comes back after its lease.
        assert done.wait(90)
    finally:
        worker.stop()
        thread.join(60)
    assert attempts == [1, 2]
    assert wait_until(lambda: not Jobs.objects.filter(pk=sent.key[0]).exists(), timeout=30)


def test_attempt_increases_by_one_per_delivery_of_an_unacked_message() -> None:

    assert not queue_options(Jobs).max_attempts
    policy = DeliveryPolicy(engine_for(Jobs))
    Jobs.send(payload="x")
    seen: list[int | None] = []
    try:
        for _ in range(3):
            [message] = wait_until(lambda: api.receive(Jobs), timeout=90)
            seen.append(message.attempt)
            # A failed run, as the worker reports it (recorded where the engine keeps no
            # count on the row); then the message comes back (released, or after its lease).
            failure = policy.fail(Jobs, message, RuntimeError("failed"), using="default")
            assert failure.attempt == message.attempt
            policy.give_back(Jobs, message, deliver_time=clock.now())
    finally:
        api.stop_receiving(Jobs, wait=10)
    assert seen == [1, 2, 3]

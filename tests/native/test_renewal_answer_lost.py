"""``RENEWLEASE_<Q>`` is not idempotent: each call rotates the token. A renewal whose answer is
lost (the call applied on Spanner, ``UNAVAILABLE`` to the client; injected on the front after
the call ran) is sent once, never again with the token it rotated out: the message is kept
with the lease it had, its old token and expiry, until that expiry (at worst it runs out
then), so a run that ends before it acks as usual (Spanner acks by key)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from spanner_queues import api, clock
from spanner_queues.message import Message
from spanner_queues.receivers import ReceiverRegistry
from spanner_queues.receivers import receiver as register_receiver
from spanner_queues.worker import Worker
from tests.conftest import wait_until
from tests.testapp.models import UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_renewal_whose_answer_is_lost_is_sent_once_and_keeps_the_old_lease(front) -> None:
    UserTasks.send(user_id=1, message_id="a", payload="")
    [message] = wait_until(lambda: api.receive(UserTasks))
    front.record()
    front.fail(
        "ExecuteSql", "UNAVAILABLE", "connection reset", sql_contains="RENEWLEASE_", after=True
    )
    kept = api.renew_many([message])
    assert len(front.sql("RENEWLEASE_")) == 1  # sent once: a second call would find its
    # token rotated out and report the lease lost
    assert [(m.key, m.lease_token, m.lease_expires_at) for m in kept] == [
        (message.key, message.lease_token, message.lease_expires_at)
    ]
    again = api.renew_many(kept)  # asked again: no call with the rotated-out token
    assert len(front.sql("RENEWLEASE_")) == 1
    assert [m.lease_token for m in again] == [message.lease_token]
    api.ack(message)  # by key: the run that ends before the old expiry is acked
    assert not UserTasks.objects.exists()


def test_a_renewal_whose_answer_is_lost_loses_the_lease_at_its_old_expiry(front) -> None:
    UserTasks.send(user_id=1, message_id="b", payload="")
    [message] = wait_until(lambda: api.receive(UserTasks))
    front.fail(
        "ExecuteSql", "UNAVAILABLE", "connection reset", sql_contains="RENEWLEASE_", after=True
    )
    assert len(api.renew_many([message])) == 1
    wait_until(lambda: clock.now() > message.lease_expires_at, timeout=15)
    assert api.renew_many([message]) == []  # past the old expiry: lost, as far as we know


def test_a_worker_whose_renewal_answer_is_lost_finishes_its_run_once(front) -> None:
    """The run outlives the first renewal (halfway through the 10 s lease), whose answer is
    lost, and ends before the old expiry: acked once, no ``LeaseLost``, nothing run twice."""
    runs: list[int] = []
    registry = ReceiverRegistry()

    @register_receiver(UserTasks, registry=registry, atomic=False)
    def slow(message: Message) -> None:
        runs.append(message.attempt)
        until = message.lease_expires_at - timedelta(seconds=2)
        wait_until(lambda: timezone.now() > until, timeout=15)

    UserTasks.send(user_id=1, message_id="c", payload="")
    front.fail(
        "ExecuteSql", "UNAVAILABLE", "connection reset", sql_contains="RENEWLEASE_", after=True
    )
    events: list[str] = []
    worker = Worker(
        [UserTasks],
        registry=registry,
        burst=True,
        install_signal_handlers=False,
        listeners=[lambda e: events.append(e.name)],
    )
    stats = worker.run()
    assert runs == [1]
    assert stats.processed == 1 and stats.failed == 0
    assert "renewal_failed" not in events
    assert not UserTasks.objects.exists()

"""Conformance: receive leases what is due, at most ``max_messages``, never early and never
twice; a lease that runs out redelivers with a new token, attempts and back-off."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from spanner_queues import api
from spanner_queues.conf import BackoffPolicy
from spanner_queues.engines import engines
from spanner_queues.testing.conformance.models import Jobs, UserTasks
from spanner_queues.testing.conformance.support import receive_due, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
SHORT = timedelta(seconds=0.6)


def test_future_deliver_time_is_not_received_early() -> None:
    due = timezone.now() + timedelta(seconds=1.5)
    UserTasks.send(user_id=1, message_id="later", payload="x", deliver_time=due)
    UserTasks.send(user_id=1, message_id="far", payload="x", delay=timedelta(days=29))
    assert api.receive(UserTasks) == []
    [message] = wait_until(lambda: api.receive(UserTasks))
    assert timezone.now() >= due
    assert message.key == (1, "later")
    assert api.receive(UserTasks) == []  # the 29-day one stays put


def test_leased_message_is_not_delivered_twice() -> None:
    UserTasks.send(user_id=1, message_id="a", payload="x")
    [first] = receive_due(UserTasks, max_messages=5)
    assert api.receive(UserTasks, max_messages=5) == []
    assert first.attempt == 1


def test_lease_expiry_redelivers_with_a_new_token() -> None:
    """Every engine: a message whose lease ends unacked comes back, under a new token."""
    short = SHORT if engines["default"].features.supports_custom_lease else None
    UserTasks.send(user_id=1, message_id="a", payload="x")
    [first] = receive_due(UserTasks, lease=short)
    second = wait_until(lambda: api.receive(UserTasks, lease=short), timeout=60)[0]
    assert timezone.now() >= first.lease_expires_at
    assert second.key == first.key and second.lease_token != first.lease_token


@pytest.mark.requires("supports_attempt_count", "supports_custom_lease")
def test_lease_expiry_redelivers_with_attempts_and_backoff() -> None:
    backoff = engines["default"].params.backoff
    UserTasks.send(user_id=1, message_id="a", payload="x")
    first = receive_due(UserTasks, lease=SHORT)[0]
    # Not before the lease has expired *and* the first back-off has passed.
    earliest = first.lease_expires_at + backoff.shortest(1, timedelta(0))
    second = wait_until(lambda: api.receive(UserTasks, lease=SHORT))[0]
    assert timezone.now() >= earliest
    assert second.key == first.key
    assert second.attempt == 2
    assert second.lease_token != first.lease_token
    earliest = second.lease_expires_at + backoff.shortest(2, timedelta(0))
    third = wait_until(lambda: api.receive(UserTasks, lease=SHORT))[0]
    assert timezone.now() >= earliest
    assert third.attempt == 3
    assert backoff.shortest(2, timedelta(0)) > backoff.longest(1, timedelta(0))


def test_backoff_policy_matches_spanner_shape() -> None:
    policy = BackoffPolicy()
    delays = [policy.longest(n, timedelta(minutes=1)).total_seconds() for n in range(1, 14)]
    assert delays[:4] == [1, 2, 4, 8]
    assert max(delays) == 900  # capped inside the first hour
    assert policy.longest(3, timedelta(hours=2)) == timedelta(hours=1)  # then hourly


@pytest.mark.engine_independent
def test_a_thousand_messages_failing_together_come_back_spread_out() -> None:
    policy = BackoffPolicy()  # the default jitter: 20 % of the wait
    waits = [policy.delay(5, timedelta(minutes=1)).total_seconds() for _ in range(1000)]
    assert all(16 * 0.8 <= w <= 16 for w in waits)  # never later than the un-jittered wait
    assert len({round(w, 3) for w in waits}) > 500  # not one instant (of 3,201 millisecond steps)
    assert max(waits) - min(waits) > 16 * 0.2 * 0.8  # spread over most of the band


def test_batch_receive_respects_max_messages() -> None:
    Jobs.send_many([{"payload": str(i)} for i in range(7)])
    first = wait_until(lambda: api.receive(Jobs, max_messages=5))  # a stream starts first
    second = api.receive(Jobs, max_messages=5)
    assert len(first) == 5 and len(second) == 2
    assert not {m.key for m in first} & {m.key for m in second}
    assert api.receive(Jobs, max_messages=5) == []

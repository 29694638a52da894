"""Conformance: one transaction sends any number of messages (Google's example: one queue entry
per invitee in the transaction that creates the event), past Spanner's 950-parameter limit of
one statement."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

from spanner_queues import api, clock
from spanner_queues.testing.conformance.models import Account, UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_transaction_sends_2000_messages_with_its_business_write() -> None:
    later = clock.now() + timedelta(hours=1)
    with transaction.atomic():
        event = Account.objects.create(name="launch party")
        sent = api.send_many(
            UserTasks,
            [
                {
                    "user_id": event.pk,
                    "message_id": f"invitee-{i}",
                    "payload": {"invitee": i},
                    # some delivered now, some later: two INSERT shapes, each chunked
                    **({"deliver_time": later} if i % 3 == 0 else {}),
                }
                for i in range(2000)
            ],
        )
    assert len(sent) == 2000
    assert UserTasks.objects.filter(user_id=event.pk).count() == 2000


def test_a_failed_fan_out_sends_nothing() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        event = Account.objects.create(name="cancelled")
        api.send_many(
            UserTasks,
            [{"user_id": event.pk, "message_id": f"i{i}", "payload": b"x"} for i in range(1200)],
        )
        raise RuntimeError("the event was not created after all")
    assert not UserTasks.objects.exists()

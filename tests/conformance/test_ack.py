"""Conformance: ack is a delete by key in the caller's transaction, at most once."""

from __future__ import annotations

import pytest
from django.db import transaction

from spanner_queues import api
from spanner_queues.exceptions import MessageAlreadyAcked
from tests.conftest import receive_due
from tests.testapp.models import Account, UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_ack_deletes_with_business_writes() -> None:
    UserTasks.send(user_id=1, message_id="a", payload="x")
    message = receive_due(UserTasks)[0]
    with transaction.atomic():
        Account.objects.create(name="done")
        api.ack(message)
    assert Account.objects.count() == 1
    assert not UserTasks.objects.exists()


def test_ack_in_rolled_back_transaction_leaves_message() -> None:
    UserTasks.send(user_id=1, message_id="a", payload="x")
    message = receive_due(UserTasks)[0]
    with pytest.raises(RuntimeError), transaction.atomic():
        api.ack(message)
        Account.objects.create(name="work")
        raise RuntimeError("receiver failed")
    assert UserTasks.objects.filter(pk=(1, "a")).exists()
    assert not Account.objects.exists()


def test_second_ack_is_detected() -> None:
    UserTasks.send(user_id=1, message_id="a", payload="x")
    message = receive_due(UserTasks)[0]
    api.ack(message)
    with pytest.raises(MessageAlreadyAcked, match="already acked"), transaction.atomic():
        Account.objects.create(name="duplicate work")
        api.ack(message)
    assert not Account.objects.exists()


def test_ack_many_is_all_or_nothing() -> None:
    UserTasks.send_many([{"user_id": 1, "message_id": m, "payload": ""} for m in "abc"])
    batch = receive_due(UserTasks, 3, max_messages=3)
    api.ack(batch[0])
    with pytest.raises(MessageAlreadyAcked), transaction.atomic():
        api.ack_many(UserTasks, batch)
    assert UserTasks.objects.count() == 2
    with transaction.atomic():
        api.ack_many(UserTasks, batch[1:])
    assert not UserTasks.objects.exists()


def test_ack_does_not_check_the_lease_token() -> None:
    # As in Spanner: ack goes by key; an undelivered (scheduled) message can be cancelled too.
    UserTasks.send(user_id=9, message_id="cancel-me", payload="")
    api.ack_many(UserTasks, [{"user_id": 9, "message_id": "cancel-me"}])
    assert not UserTasks.objects.exists()

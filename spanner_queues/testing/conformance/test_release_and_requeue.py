"""Conformance: ``api.release`` gives a leased message back, due again (or is refused where the
engine cannot); ``api.requeue`` acks a message with the lease it holds and sends it again under
the same key (or to another queue) in one transaction: both or neither."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from spanner_queues import api
from spanner_queues.exceptions import (
    LeaseLost,
    MessageAlreadyAcked,
    NotSupportedByEngine,
    QueueConfigurationError,
    StaleAck,
)
from spanner_queues.testing.conformance.models import Account, Emails, EmailsDead, Jobs, UserTasks
from spanner_queues.testing.conformance.support import receive_due

pytestmark = pytest.mark.django_db(transaction=True)


def test_requeue_acks_and_sends_again_under_the_same_key_with_the_callers_writes() -> None:
    UserTasks.send(user_id=1, message_id="a", payload="first")
    message = receive_due(UserTasks)[0]
    with transaction.atomic():
        Account.objects.create(name="step one")
        again = api.requeue(message, delay=timedelta(hours=1), payload="second")
    assert again.key == message.key
    row = UserTasks.objects.get(pk=(1, "a"))
    assert bytes(row.payload) == b"second"
    assert row.deliver_time > timezone.now() + timedelta(minutes=50)
    assert Account.objects.count() == 1


def test_requeue_rolls_back_with_the_callers_transaction() -> None:
    UserTasks.send(user_id=1, message_id="a", payload="first")
    message = receive_due(UserTasks)[0]
    with pytest.raises(RuntimeError), transaction.atomic():
        api.requeue(message, delay=timedelta(hours=1), payload="second")
        raise RuntimeError("the receiver failed after requeueing")
    assert bytes(UserTasks.objects.get(pk=(1, "a")).payload) == b"first"


def test_requeue_of_a_message_already_acked_sends_nothing() -> None:
    UserTasks.send(user_id=1, message_id="a", payload="first")
    message = receive_due(UserTasks)[0]
    api.ack(message)
    with pytest.raises(MessageAlreadyAcked):
        api.requeue(message, payload="second")
    assert not UserTasks.objects.exists()


def test_requeue_to_another_queue_moves_the_message() -> None:
    Emails.send(id="e1", payload="hello")
    message = receive_due(Emails)[0]
    moved = api.requeue(message, to=EmailsDead)
    assert moved.queue == EmailsDead._meta.label
    assert not Emails.objects.exists()
    assert bytes(EmailsDead.objects.get(pk="e1").payload) == b"hello"


def test_requeue_to_a_queue_with_other_key_fields_is_refused_before_any_write() -> None:
    UserTasks.send(user_id=1, message_id="a", payload="first")
    message = receive_due(UserTasks)[0]
    with pytest.raises(QueueConfigurationError, match="key fields"):
        api.requeue(message, to=Emails)
    assert UserTasks.objects.filter(pk=(1, "a")).exists()
    assert not Emails.objects.exists()


@pytest.mark.requires("supports_lease_checked_ack")
def test_requeue_with_a_stale_lease_leaves_the_newer_message() -> None:
    UserTasks.send(user_id=1, message_id="k", payload="old")
    old = receive_due(UserTasks)[0]
    api.replace(UserTasks, {"user_id": 1, "message_id": "k"}, payload="new")
    with pytest.raises(StaleAck):
        api.requeue(old, payload="older state")
    assert bytes(UserTasks.objects.get(pk=(1, "k")).payload) == b"new"


@pytest.mark.unless("supports_release")
def test_release_is_refused_where_unsupported() -> None:
    Jobs.send(payload="x")
    [message] = receive_due(Jobs)
    with pytest.raises(NotSupportedByEngine):
        api.release(message)


@pytest.mark.requires("supports_release")
def test_release_makes_message_due_again() -> None:
    Jobs.send(payload="x")
    message = receive_due(Jobs)[0]
    api.release(message)
    again = receive_due(Jobs)[0]
    assert again.key == message.key and again.attempt == 2
    with pytest.raises(LeaseLost):
        api.release(message)  # old token

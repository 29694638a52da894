"""An ack that finds no message, or a lease no longer the message's, names the queue and the key
as ``docs/quickstart.md`` shows it (``tasks.UserTasks(1, 'welcome'): no such message; ...``),
the same words on every engine."""

from __future__ import annotations

import traceback

import pytest
from django.db import transaction

from spanner_queues import api
from spanner_queues.exceptions import MessageAlreadyAcked, StaleAck
from spanner_queues.testing.conformance.support import receive_due
from tests.testapp.models import UserTasks

pytestmark = pytest.mark.django_db(transaction=True)

LABEL = UserTasks._meta.label


def test_a_second_ack_names_the_message_as_the_quickstart_shows() -> None:
    UserTasks.send(user_id=1, message_id="welcome", payload="hi")
    [message] = receive_due(UserTasks)
    api.ack(message)
    with pytest.raises(MessageAlreadyAcked) as caught, transaction.atomic():
        api.ack(message)
    assert str(caught.value) == (
        f"{LABEL}(1, 'welcome'): no such message; it was already acked (or deleted). Roll "
        "back: the work may have been done by another receiver."
    )


def test_a_second_ack_prints_one_error_not_the_drivers_chain() -> None:
    # On native queues it printed the gRPC error, the DB-API's and Django's before it, each
    # "the direct cause of" the next: the message says it all, in one traceback.
    UserTasks.send(user_id=1, message_id="twice", payload="hi")
    [message] = receive_due(UserTasks)
    api.ack(message)
    with pytest.raises(MessageAlreadyAcked) as caught, transaction.atomic():
        api.ack(message)
    printed = "".join(traceback.format_exception(caught.value))
    assert printed.count("Traceback (most recent call last)") == 1, printed
    assert "direct cause" not in printed and "During handling" not in printed, printed
    assert printed.rstrip().splitlines()[-1] == (
        f"spanner_queues.exceptions.MessageAlreadyAcked: {LABEL}(1, 'twice'): no such message; "
        "it was already acked (or deleted). Roll back: the work may have been done by another "
        "receiver."
    )


@pytest.mark.requires("supports_lease_checked_ack")
def test_a_stale_ack_names_the_message_in_the_same_words() -> None:
    UserTasks.send(user_id=1, message_id="k", payload="old")
    [old] = receive_due(UserTasks)
    api.replace(UserTasks, {"user_id": 1, "message_id": "k"}, payload="new")
    with pytest.raises(StaleAck) as caught, transaction.atomic():
        api.ack(old)
    assert str(caught.value).startswith(f"{LABEL}(1, 'k'): the lease this ack holds is no longer")

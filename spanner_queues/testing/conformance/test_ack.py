"""Conformance: ack is a delete by key in the caller's transaction, at most once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

from spanner_queues import api
from spanner_queues.engines import engines
from spanner_queues.exceptions import MessageAlreadyAcked, StaleAck
from spanner_queues.patterns import resend_later
from spanner_queues.testing.conformance.models import Account, Jobs, UserTasks
from spanner_queues.testing.conformance.support import receive_due

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


# --- a failed ack marks the transaction for rollback (issue 15 #9) ---------------------------
def test_a_caught_already_acked_still_rolls_back_the_transaction() -> None:
    """Spanner's rule on every engine: a failed ack is statement-level; the transaction must not
    commit the receiver's writes without its ack, even if the receiver catches the error."""
    UserTasks.send(user_id=1, message_id="a", payload="x")
    message = receive_due(UserTasks)[0]
    api.ack(message)
    with transaction.atomic():
        Account.objects.create(name="work done twice")
        try:
            api.ack(message)
        except MessageAlreadyAcked:
            pass
    assert not Account.objects.exists()


def test_a_caught_already_acked_from_ack_many_and_helpers_rolls_back() -> None:
    UserTasks.send_many([{"user_id": 1, "message_id": m, "payload": ""} for m in "ab"])
    a, b = receive_due(UserTasks, 2, max_messages=2)
    api.ack(a)
    with transaction.atomic():
        Account.objects.create(name="batch")
        with pytest.raises(MessageAlreadyAcked):
            api.ack_many(UserTasks, [a, b])
    with transaction.atomic():
        Account.objects.create(name="helper")
        with pytest.raises(MessageAlreadyAcked):
            resend_later(a, after=timedelta(0))
    assert not Account.objects.exists()
    assert UserTasks.objects.filter(pk=b.key).exists()  # (receive order is not send order)


# --- stale acks under reused keys (issue 15 #2) -----------------------------------------------
def _lease_checked() -> None:
    if not engines["default"].features.supports_lease_checked_ack:
        pytest.skip("the engine acks by key alone (native Spanner)")


def test_a_stale_ack_does_not_delete_a_newer_message_under_the_same_key() -> None:
    _lease_checked()
    UserTasks.send(user_id=1, message_id="k", payload="old")
    old = receive_due(UserTasks)[0]
    api.replace(UserTasks, {"user_id": 1, "message_id": "k"}, payload="new")  # a producer
    with pytest.raises(StaleAck), transaction.atomic():
        Account.objects.create(name="work on the old payload")
        api.ack(old)
    assert not Account.objects.exists()
    assert bytes(UserTasks.objects.get(pk=(1, "k")).payload) == b"new"
    with pytest.raises(StaleAck):  # the helpers carry the lease too: no checkpoint backwards
        resend_later(old, after=timedelta(0), payload="older state")
    with pytest.raises(StaleAck):
        api.ack_many(UserTasks, [old])
    assert bytes(UserTasks.objects.get(pk=(1, "k")).payload) == b"new"
    assert UserTasks.objects.get(pk=(1, "k")).lease_token is None


def test_a_released_message_is_not_acked_by_its_old_lease() -> None:
    _lease_checked()
    UserTasks.send_many([{"user_id": 2, "message_id": m, "payload": ""} for m in "xy"])
    x, y = receive_due(UserTasks, 2, max_messages=2)
    api.release(x)
    with pytest.raises(StaleAck), transaction.atomic():
        api.ack_many(UserTasks, [x, y])
    assert UserTasks.objects.count() == 2  # all or nothing
    api.ack(y)
    api.ack_many(UserTasks, [{"user_id": 2, "message_id": "x"}])  # by key: still possible
    assert not UserTasks.objects.exists()


def test_a_renewed_lease_acks_with_its_new_token_and_the_old_one_is_stale() -> None:
    _lease_checked()
    if not engines["default"].features.rotates_lease_tokens:
        pytest.skip("renewal keeps the token")
    UserTasks.send(user_id=3, message_id="r", payload="")
    first = receive_due(UserTasks)[0]
    renewed = api.renew(first)
    with pytest.raises(StaleAck):
        api.ack(first)
    api.ack(renewed)
    assert not UserTasks.objects.exists()


def test_ack_many_of_the_same_message_twice_raises_already_acked() -> None:
    """At most once within one call too: ``ack_many([m, m])`` raises ``MessageAlreadyAcked``,
    as two ``ack(m)`` would (a presence check by set that ignored the DELETE's row count once
    let it succeed)."""
    m = Jobs.send(payload="x")
    with pytest.raises(MessageAlreadyAcked):
        with transaction.atomic():
            api.ack_many(Jobs, [m, m])


def test_ack_many_of_several_with_one_already_acked_deletes_none() -> None:
    """Every engine's batch ack is all or nothing: one key already acked (by another receiver)
    fails the whole ``ack_many`` and leaves the others, outside a transaction too."""
    a, b, c = (Jobs.send(payload=p) for p in "abc")
    api.ack(b)
    with pytest.raises(MessageAlreadyAcked):
        api.ack_many(Jobs, [a, b, c])
    left = sorted(
        p for p in Jobs.objects.values_list("payload", flat=True) if p in (b"a", b"b", b"c")
    )
    assert left == [b"a", b"c"]

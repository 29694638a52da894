"""Conformance regressions from the review of the API verbs: key values are validated, and
ack_many is at most once even outside a transaction."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from spanner_queues import api
from spanner_queues.engines.table_acks import TableAcks
from spanner_queues.exceptions import InvalidMessage, MessageAlreadyAcked, QueueError
from spanner_queues.models import QueueQuerySet
from tests.testapp.models import Jobs, UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_send_with_a_key_of_the_wrong_type_raises_invalid_message() -> None:
    """guarantees.md: "a malformed key ... raise(s) InvalidMessage ... and write nothing".
    build_message() never converts/validates key values, so a non-numeric value for a
    BigIntegerField key escapes as a raw ValueError from the ORM (not a QueueError)."""
    with pytest.raises(InvalidMessage):
        UserTasks.send(user_id="not-a-number", message_id="welcome")


def test_send_with_a_null_key_raises_invalid_message() -> None:
    """A missing key value given as None is not caught by build_message(); the INSERT fails
    with a raw django.db.IntegrityError ("NOT NULL constraint failed"), which the engine
    re-raises because it is not a duplicate key."""
    with pytest.raises(QueueError):
        with transaction.atomic():
            UserTasks.send(user_id=None, message_id="welcome")


def test_ack_many_with_the_same_message_twice_is_not_at_most_once() -> None:
    """ack_many([m, m]) deletes one row and succeeds: the presence check uses a set and the
    DELETE's row count is ignored, so a double ack in one call is not detected (the
    single-key path checks the count and would raise)."""
    m = Jobs.send(payload="x")
    with pytest.raises(MessageAlreadyAcked):
        with transaction.atomic():
            api.ack_many(Jobs, [m, m])


@pytest.mark.requires("stores_bookkeeping_fields")  # the table engine's check-then-delete
def test_ack_many_outside_a_transaction_detects_a_concurrent_ack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ack_many() of several keys is check-then-delete: SELECT the present keys, then DELETE,
    ignoring the DELETE's row count. Outside atomic() (autocommit, a public use of the API)
    another receiver's ack can commit in between; both callers then "succeed" and the
    at-most-once ack (guarantees.md) is violated. Here the concurrent ack is simulated by
    deleting one message just before the DELETE runs."""
    a, b = Jobs.send(payload="a"), Jobs.send(payload="b")
    real = QueueQuerySet._raw_delete
    fired: list[bool] = []

    def racing_delete(self: Any, using: str) -> int:
        if not fired:
            fired.append(True)
            api.ack(b)  # another receiver wins the race for b
        return real(self, using)

    monkeypatch.setattr(QueueQuerySet, "_raw_delete", racing_delete)
    # (the table engine's per-key path runs each DELETE with its own count check: the
    # set-based path is the one this race is about)
    monkeypatch.setattr(TableAcks, "_delete_each", staticmethod(lambda *args: False))
    with pytest.raises(MessageAlreadyAcked):
        api.ack_many(Jobs, [a, b])  # autocommit: no transaction of the caller


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

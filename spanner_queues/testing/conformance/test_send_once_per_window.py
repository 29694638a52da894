"""Conformance: ``send(..., unique_for=)`` sends a key at most once per window, in the sender's
transaction, even after the first message was handled."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from spanner_queues import api, clock, uniqueness
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import InvalidArgument
from spanner_queues.testing.conformance.models import Account, UserTasks
from spanner_queues.testing.conformance.support import receive_due
from spanner_queues.uniqueness import SentKey, key_text, prune, sent_key_id

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = timedelta(hours=1)


class _Clock:
    """The ledger's time (``spanner_queues.clock``), moved by hand; messages are sent due now
    on the database's clock, so it starts at the real time."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return timezone.now() + self.offset


@pytest.fixture
def moved() -> Iterator[_Clock]:
    c = _Clock()
    clock.install(c.now)
    try:
        yield c
    finally:
        clock.uninstall(c.now)


def _ledger_id(user_id: int, message_id: str) -> str:
    return sent_key_id(UserTasks._meta.label, key_text((user_id, message_id)))


def test_a_second_send_within_the_window_is_dropped_even_after_the_first_was_acked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = UserTasks.send(user_id=1, message_id="digest", payload="1", unique_for=HOUR)
    assert first.dropped is False
    [message] = receive_due(UserTasks)
    api.ack(message)
    with caplog.at_level(logging.INFO, logger="spanner_queues.uniqueness"):
        second = UserTasks.send(user_id=1, message_id="digest", payload="2", unique_for=HOUR)
    assert second.dropped is True and second.key == (1, "digest")
    assert not UserTasks.objects.exists()
    assert any(
        UserTasks._meta.label in r.getMessage() and "digest" in r.getMessage()
        for r in caplog.records
    )


def test_a_send_after_the_window_is_accepted(moved: _Clock) -> None:
    UserTasks.send(user_id=1, message_id="digest", unique_for=HOUR)
    api.ack(receive_due(UserTasks)[0])
    moved.offset = HOUR + timedelta(seconds=1)
    again = api.send(UserTasks, user_id=1, message_id="digest", unique_for=HOUR)
    assert again.dropped is False
    assert UserTasks.objects.count() == 1
    row = SentKey.objects.get(pk=_ledger_id(1, "digest"))
    assert row.window_ends_at > clock.now() + HOUR - timedelta(minutes=1)


def test_other_keys_are_not_affected() -> None:
    UserTasks.send(user_id=1, message_id="digest", unique_for=HOUR)
    sent = UserTasks.send_many(
        [
            {"user_id": 2, "message_id": "digest"},
            {"user_id": 1, "message_id": "digest"},
            {"user_id": 1, "message_id": "other"},
            {"user_id": 1, "message_id": "other"},  # twice in one batch: the second dropped
        ],
        unique_for=HOUR,
    )
    assert [m.dropped for m in sent] == [False, True, False, True]
    assert sorted(r.message_id for r in UserTasks.objects.all()) == ["digest", "digest", "other"]
    # a plain send of another key is not looked up at all
    UserTasks.send(user_id=3, message_id="digest")
    assert not SentKey.objects.filter(pk=_ledger_id(3, "digest")).exists()


def test_a_rolled_back_send_leaves_no_ledger_row() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Account.objects.create(name="ada")
        UserTasks.send(user_id=1, message_id="digest", unique_for=HOUR)
        raise RuntimeError("boom")
    assert not SentKey.objects.exists() and not UserTasks.objects.exists()
    assert UserTasks.send(user_id=1, message_id="digest", unique_for=HOUR).dropped is False


def test_the_claim_is_in_the_senders_transaction() -> None:
    with transaction.atomic():
        Account.objects.create(name="ada")
        UserTasks.send(user_id=1, message_id="digest", unique_for=HOUR)
        assert SentKey.objects.filter(pk=_ledger_id(1, "digest")).exists()
        assert UserTasks.send(user_id=1, message_id="digest", unique_for=HOUR).dropped
    assert UserTasks.objects.count() == 1


@pytest.mark.parametrize("bad", [timedelta(0), timedelta(seconds=-1), 3600, "1h"])
def test_unique_for_must_be_a_positive_timedelta(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="positive timedelta"):
        UserTasks.send(user_id=1, message_id="digest", unique_for=bad)  # type: ignore[arg-type]
    assert not UserTasks.objects.exists() and not SentKey.objects.exists()


def test_prune_deletes_rows_whose_window_ended(moved: _Clock) -> None:
    UserTasks.send(user_id=1, message_id="short", unique_for=timedelta(minutes=1))
    UserTasks.send(user_id=1, message_id="long", unique_for=HOUR)
    moved.offset = timedelta(minutes=2)
    assert prune(using=engine_for(UserTasks).database) == 1
    assert list(SentKey.objects.values_list("pk", flat=True)) == [_ledger_id(1, "long")]


def test_a_claim_marks_the_ledger_due_a_prune_run_outside_transactions(moved: _Clock) -> None:
    db = engine_for(UserTasks).database
    uniqueness._pruned.pop(db, None)  # as in a process that has not pruned yet
    with transaction.atomic(using=db):
        UserTasks.send(user_id=1, message_id="short", unique_for=timedelta(minutes=1))
    moved.offset = timedelta(minutes=2)
    with transaction.atomic(using=db):
        UserTasks.send(user_id=1, message_id="long", unique_for=HOUR)  # due, but in a transaction
    assert SentKey.objects.count() == 2
    api.receive(UserTasks, wait=0)
    assert list(SentKey.objects.values_list("pk", flat=True)) == [_ledger_id(1, "long")]

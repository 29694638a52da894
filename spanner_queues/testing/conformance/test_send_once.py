"""Conformance: ``send(..., unique_for=)`` sends a key once per window, in the sender's
transaction, on every engine (``spanner_queues.once``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from spanner_queues import api, clock
from spanner_queues.exceptions import InvalidArgument, MessageAlreadyExists
from spanner_queues.once import SentOnce
from spanner_queues.testing.conformance.models import Account, Jobs, UserTasks
from spanner_queues.testing.conformance.support import receive_due
from spanner_queues.testing.kit import clock_is_movable

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = timedelta(hours=1)


@contextmanager
def later(by: timedelta) -> Iterator[None]:
    """``clock.now()`` ``by`` ahead of the real time for the block (the window is read from
    it on every engine; a native queue's own times stay Spanner's)."""
    base = clock.installed() or timezone.now

    def source() -> Any:
        return base() + by

    clock.install(source)
    try:
        yield
    finally:
        clock.uninstall(source)


def test_a_second_send_within_the_window_is_dropped_even_after_the_first_was_handled() -> None:
    first = Jobs.send(id="nightly", payload=b"1", unique_for=HOUR)
    assert not first.dropped
    [message] = receive_due(Jobs)
    api.ack(message)
    again = Jobs.send(id="nightly", payload=b"2", unique_for=HOUR)
    assert again.dropped
    assert again.key == ("nightly",) and again.payload == b"2"
    assert not Jobs.objects.exists()
    assert api.receive(Jobs) == []


def test_a_send_after_the_window_is_kept_and_opens_a_new_one() -> None:
    Jobs.send(id="nightly", payload=b"1", unique_for=HOUR)
    api.ack(receive_due(Jobs)[0])
    # Where the engine takes time from the database (native queues), only the sends run in
    # the moved time: its deliver times and leases are Spanner's own.
    movable = clock_is_movable(Jobs)
    with later(HOUR + timedelta(seconds=1)):
        kept = Jobs.send(id="nightly", payload=b"2", unique_for=HOUR)
        if movable:
            api.ack(receive_due(Jobs)[0])
    assert not kept.dropped
    if not movable:
        api.ack(receive_due(Jobs)[0])
    with later(HOUR + timedelta(seconds=2)):
        assert Jobs.send(id="nightly", payload=b"3", unique_for=HOUR).dropped


def test_other_keys_and_sends_without_a_window_are_not_held_back() -> None:
    Jobs.send(id="a", unique_for=HOUR)
    assert not Jobs.send(id="b", unique_for=HOUR).dropped
    api.ack_many(Jobs, receive_due(Jobs, 2, max_messages=10))
    plain = Jobs.send(id="a")  # no window asked: sent (the window binds sends that ask)
    assert not plain.dropped
    assert [m.key for m in receive_due(Jobs)] == [("a",)]


def test_the_window_commits_with_the_sender_and_a_rolled_back_send_claims_nothing() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Account.objects.create(name="ada")
        assert not UserTasks.send(user_id=1, message_id="w", unique_for=HOUR).dropped
        raise RuntimeError("boom")
    assert not SentOnce.objects.exists() and not UserTasks.objects.exists()
    with transaction.atomic():
        Account.objects.create(name="ada")
        assert not UserTasks.send(user_id=1, message_id="w", unique_for=HOUR).dropped
    assert UserTasks.objects.count() == 1 and SentOnce.objects.count() == 1


def test_a_key_twice_in_one_send_many_is_sent_once() -> None:
    sent = Jobs.send_many(
        [
            {"id": "x", "payload": b"1", "unique_for": HOUR},
            {"id": "y", "payload": b"1"},
            {"id": "x", "payload": b"2", "unique_for": HOUR},
        ]
    )
    assert [(m.key, m.dropped) for m in sent] == [(("x",), False), (("y",), False), (("x",), True)]
    assert sorted(m.key for m in receive_due(Jobs, 2, max_messages=10)) == [("x",), ("y",)]


def test_a_window_does_not_hide_a_message_still_in_the_queue() -> None:
    """Past its window, a key whose first message is still queued is refused as always."""
    Jobs.send(id="k", unique_for=timedelta(seconds=1))
    with later(timedelta(seconds=2)), pytest.raises(MessageAlreadyExists):
        Jobs.send(id="k", unique_for=HOUR)


@pytest.mark.parametrize(
    "window", [timedelta(0), timedelta(seconds=-1), 60, "1h", timedelta(days=400)]
)
def test_a_bad_window_is_refused_and_nothing_is_written(window: Any) -> None:
    with pytest.raises(InvalidArgument, match="unique_for"):
        Jobs.send(id="k", unique_for=window)
    assert not Jobs.objects.exists() and not SentOnce.objects.exists()

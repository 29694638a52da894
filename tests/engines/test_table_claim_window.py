"""Table engine, claims picked at random among the first due rows (``Driver.claim_window``: on
Spanner, where N claimers of the head of the DeliverTime index would abort each other)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import Q
from django.utils import timezone

from spanner_queues import api
from spanner_queues.drivers import Driver, SpannerDriver
from spanner_queues.engines import table
from tests.testapp.models import UserTasks

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.unless("supports_native_queues"),  # the native engine claims with RECEIVE
]


@pytest.fixture
def window(monkeypatch: pytest.MonkeyPatch) -> int:
    for driver in (Driver, SpannerDriver):
        monkeypatch.setattr(driver, "claim_window", 3)
    return 3


def _send(n: int) -> list[tuple[int, str]]:
    base = timezone.now() - timedelta(minutes=1)
    keys = [(1, f"m{i:02d}") for i in range(n)]
    for i, (user, name) in enumerate(keys):  # deliver times in the past, in key order
        UserTasks.send(
            user_id=user, message_id=name, payload="x", deliver_time=base + timedelta(seconds=i)
        )
    return keys


def test_a_claim_takes_its_rows_among_the_first_window_times_batch_due(window: int) -> None:
    keys = _send(12)
    seen: list[tuple[int, str]] = []
    while len(seen) < len(keys):
        batch = api.receive(UserTasks, max_messages=2)
        assert len(batch) == 2
        # among the first window x 2 of the rows still due (acked ones are gone)
        remaining = [k for k in keys if k not in seen]
        assert {m.key for m in batch} <= set(remaining[: window * 2])
        seen += [m.key for m in batch]
        api.ack_many(UserTasks, batch)
    assert sorted(seen) == keys  # each exactly once
    assert api.receive(UserTasks) == []


def test_rows_picked_but_taken_meanwhile_fall_back_to_the_head(
    window: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _send(3)
    [held] = api.receive(UserTasks, max_messages=1)
    # the pick races with that claim and loses: it names only the row now leased
    monkeypatch.setattr(
        table, "pick_due", lambda *args: Q(user_id=held.key[0], message_id=held.key[1])
    )
    [message] = api.receive(UserTasks, max_messages=1)
    assert message.key != held.key  # claimed from the head instead of returning nothing
    assert message.attempt == 1

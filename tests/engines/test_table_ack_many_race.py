"""The table engine's set-based ``ack_many`` is at most once outside a transaction too: a
concurrent ack between its check and its delete fails the batch."""

from __future__ import annotations

from typing import Any

import pytest

from spanner_queues import api
from spanner_queues.engines.table import TableQueueEngine
from spanner_queues.exceptions import MessageAlreadyAcked
from spanner_queues.models import QueueQuerySet
from tests.testapp.models import Jobs

pytestmark = pytest.mark.django_db(transaction=True)


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
    monkeypatch.setattr(TableQueueEngine, "_delete_each", staticmethod(lambda *args: False))
    with pytest.raises(MessageAlreadyAcked):
        api.ack_many(Jobs, [a, b])  # autocommit: no transaction of the caller

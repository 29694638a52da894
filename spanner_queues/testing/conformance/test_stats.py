"""Conformance: ``engine.stats(model)``: the states partition the queue."""

from __future__ import annotations

from datetime import timedelta

import pytest

from spanner_queues.engines import engines
from spanner_queues.testing.conformance.models import Jobs
from spanner_queues.testing.conformance.support import receive_due

pytestmark = pytest.mark.django_db(transaction=True)


def test_stats_add_up() -> None:
    """Every engine: the states partition the queue; a future message is scheduled."""
    Jobs.send_many([{"payload": "r"}, {"payload": "r"}, {"payload": "s", "delay": timedelta(1)}])
    receive_due(Jobs)
    stats = engines["default"].stats(Jobs)
    assert stats.total == 3 == stats.ready + stats.leased + stats.scheduled
    assert stats.scheduled >= 1 and stats.oldest_age is not None


@pytest.mark.requires("stores_bookkeeping_fields")  # leases and attempts are columns
def test_stats_count_states() -> None:
    Jobs.send_many([{"payload": "r"}, {"payload": "r"}, {"payload": "s", "delay": timedelta(1)}])
    receive_due(Jobs)
    stats = engines["default"].stats(Jobs)
    assert (stats.total, stats.ready, stats.leased, stats.scheduled) == (3, 1, 1, 1)
    assert stats.oldest_age is not None and stats.max_attempts == 1

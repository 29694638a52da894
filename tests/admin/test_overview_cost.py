"""The overview's own refreshes (every ``OVERVIEW_REFRESH_SECONDS``, per open tab) read each
queue's stats (a scan of the queue) through the process's stats cache: however many tabs
refresh, each queue is scanned at most once per refresh interval. A page the operator loads
reads them now."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest
from django.test import Client

from spanner_queues.admin.views import OVERVIEW_REFRESH_SECONDS
from spanner_queues.engines import engines
from spanner_queues.engines.stats import stats_cache
from spanner_queues.queues import queue_models
from tests.admin.conftest import OVERVIEW

pytestmark = pytest.mark.django_db(transaction=True)
REFRESH = {"HTTP_X_REQUESTED_WITH": "XMLHttpRequest"}  # what overview.js sends


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    calls: list[str] = []
    engine_class = type(engines["default"])
    real = engine_class.stats

    def counted(self: object, model: type) -> object:
        calls.append(model._meta.label)
        return real(self, model)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_class, "stats", counted)
    stats_cache.clear()
    yield calls
    stats_cache.clear()


def test_refreshes_of_many_tabs_scan_each_queue_once_per_interval(
    operator_client: Client, scans: list[str]
) -> None:
    queues = len(queue_models())
    assert operator_client.get(OVERVIEW).status_code == 200  # the operator opens the page
    assert len(scans) == queues
    started = time.monotonic()
    for _ in range(10):  # ten tabs refresh
        assert operator_client.get(OVERVIEW, **REFRESH).status_code == 200
    elapsed = time.monotonic() - started
    # each queue once per refresh interval at most (10 refreshes within one: no scan at all)
    bound = queues * (1 + math.ceil(elapsed / OVERVIEW_REFRESH_SECONDS))
    assert len(scans) <= bound, (len(scans), bound, elapsed)
    before = len(scans)
    assert operator_client.get(OVERVIEW).status_code == 200  # a page load reads now
    assert len(scans) == before + queues

"""Depth samples: what the worker or the overview records, and the chart drawn from them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from spanner_queues import api
from spanner_queues.admin.chart import depth_chart, recent_samples
from spanner_queues.engines import engines
from spanner_queues.monitoring import SAMPLE_RETENTION, QueueDepthSample, record_depth_samples
from tests.admin.conftest import queue_url
from tests.testapp.models import Jobs

pytestmark = pytest.mark.django_db(transaction=True)


def test_record_depth_samples_for_every_queue_and_at_most_every_interval() -> None:
    Jobs.send(payload="a")
    Jobs.send(payload="b", delay=timedelta(hours=1))
    samples = record_depth_samples()
    jobs = next(s for s in samples if s.queue == "testapp.Jobs")
    assert (jobs.total, jobs.ready, jobs.scheduled, jobs.leased) == (2, 1, 1, 0)
    assert record_depth_samples([Jobs], min_interval=timedelta(minutes=1)) == []
    assert len(record_depth_samples([Jobs])) == 1
    assert QueueDepthSample.objects.filter(queue="testapp.Jobs").count() == 2


def test_old_samples_are_pruned() -> None:
    old = timezone.now() - SAMPLE_RETENTION - timedelta(hours=1)
    QueueDepthSample.objects.create(
        queue="testapp.Jobs", measured_at=old, total=1, ready=1, scheduled=0, leased=0
    )
    record_depth_samples([Jobs])
    assert [s.measured_at > old for s in QueueDepthSample.objects.all()] == [True]


def test_chart_rises_with_a_growing_backlog() -> None:
    start = timezone.now() - timedelta(minutes=10)
    for minute, depth in enumerate([0, 2, 5, 9]):
        QueueDepthSample.objects.create(
            queue="testapp.Jobs",
            measured_at=start + timedelta(minutes=minute),
            total=depth,
            ready=depth,
            scheduled=0,
            leased=0,
        )
    chart = depth_chart(recent_samples("testapp.Jobs"), width=100, height=40)
    assert chart is not None and chart.peak == 9 and chart.total.last == 9
    ys = [float(p.split(",")[1]) for p in chart.total.points.split()]
    assert ys == sorted(ys, reverse=True)  # SVG y grows downwards: the line climbs
    assert depth_chart([]) is None
    one = depth_chart(recent_samples("testapp.Jobs")[-1:])
    assert one is not None and len(one.total.points.split()) == 2  # a flat line


def test_the_queue_chart_ends_at_the_live_counts(operator_client: Client) -> None:
    Jobs.send(id="a", payload="x")
    Jobs.send(id="b", payload="y")
    record_depth_samples([Jobs])  # what a worker or cron job does: total 2
    api.ack_many(Jobs, [("a",)])
    chart = operator_client.get(queue_url("testapp.Jobs")).context["chart"]
    if engines["default"].features.stores_bookkeeping_fields:
        assert [s.name for s in chart.series] == ["total", "ready", "scheduled", "leased"]
    else:  # no lease columns: the states of a native queue are not told apart
        assert [s.name for s in chart.series] == ["total"]
    assert chart.total.last == 1 and chart.peak == 2
    assert QueueDepthSample.objects.filter(queue="testapp.Jobs").count() == 1  # live: not stored

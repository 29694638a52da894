"""Samples of queue depth over time, for the admin's depth chart: the ``QueueDepthSample`` model
(app ``spanner_queues``: ``spanner_queues.models`` imports it) and the writer of its rows.

``record_depth_samples()`` stores one ``QueueDepthSample`` per declared queue from
``engine.stats()``. A worker (a ``periodic`` receiver) or a cron job calls it on its own
schedule so that the depth chart shows a backlog growing while nobody looks; the admin pages
only read samples (a GET writes nothing) and end the chart with the live counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import models

from spanner_queues import clock
from spanner_queues.engines import engine_for
from spanner_queues.queues import queue_models

if TYPE_CHECKING:
    from spanner_queues.engines.base import QueueStats
    from spanner_queues.models import Queue

__all__ = ["SAMPLE_RETENTION", "QueueDepthSample", "record_depth_samples"]


class QueueDepthSample(models.Model):
    """The counts of one queue at one moment, for the admin's depth chart."""

    queue = models.CharField(max_length=200)
    measured_at = models.DateTimeField()
    total = models.PositiveIntegerField()
    ready = models.PositiveIntegerField()
    scheduled = models.PositiveIntegerField()
    leased = models.PositiveIntegerField()

    class Meta:
        verbose_name = "queue depth sample"
        indexes = [models.Index(fields=["queue", "measured_at"], name="sq_depth_queue_time")]
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.queue} at {self.measured_at:%Y-%m-%d %H:%M:%S}: {self.total}"

    @classmethod
    def from_stats(cls, stats: QueueStats) -> QueueDepthSample:
        return cls(
            queue=stats.queue,
            measured_at=stats.measured_at,
            total=stats.total,
            ready=stats.ready,
            scheduled=stats.scheduled,
            leased=stats.leased,
        )


#: samples older than this are deleted when new ones are recorded.
SAMPLE_RETENTION = timedelta(days=7)


def _due(queue: str, now: datetime, min_interval: timedelta | None) -> bool:
    if not min_interval:
        return True
    return not QueueDepthSample.objects.filter(
        queue=queue, measured_at__gt=now - min_interval
    ).exists()


def record_depth_samples(
    queues: Iterable[type[Queue]] | None = None,
    *,
    min_interval: timedelta | None = None,
    stats: Iterable[QueueStats] = (),
) -> list[QueueDepthSample]:
    """Store a depth sample for each queue (default: every declared queue).

    With ``min_interval``, skip queues sampled more recently than that. ``stats`` already
    measured (by the overview) are used instead of asking the engine again. Samples older than
    ``SAMPLE_RETENTION`` are deleted.
    """
    now = clock.now()
    known = {s.queue: s for s in stats}
    samples = []
    for model in queue_models() if queues is None else queues:
        label = model._meta.label
        if not _due(label, now, min_interval):
            continue
        measured = known.get(label) or engine_for(model).stats(model)
        samples.append(QueueDepthSample.from_stats(measured))  # (counts never negative)
    if samples:
        QueueDepthSample.objects.bulk_create(samples)
        QueueDepthSample.objects.filter(measured_at__lt=now - SAMPLE_RETENTION).delete()
    return samples

"""The admin's own models: ``Queues`` (no table; the admin's permissions and index entry) and
``QueueDepthSample`` (the depth chart's history, written by
``spanner_queues.monitoring.record_depth_samples``).

They belong to the ``spanner_queues`` app (``spanner_queues.models`` imports them, so app label,
tables and migration state are those of the app); they import nothing of the package at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models

if TYPE_CHECKING:
    from spanner_queues.engines.base import QueueStats


class Queues(models.Model):
    """No table: carries the admin's permissions and its entry on the admin index.

    ``view_queues`` lets staff see the queue pages; each kind of action has its own permission.
    """

    class Meta:
        managed = False
        verbose_name = "queue"
        verbose_name_plural = "queues"
        default_permissions = ("view",)
        permissions = [
            ("ack_message", "Can ack (delete) queue messages"),
            ("reschedule_message", "Can deliver queue messages now or reschedule them"),
            ("dead_letter_message", "Can move messages to and replay them from dead-letter queues"),
            ("pause_queue", "Can pause and resume queues for every worker"),
        ]

    def __str__(self) -> str:
        return "queues"


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

"""Periodic jobs: ``@periodic`` registers a receiver that runs the function, then acks its
message and sends the next run, in the same transaction. The worker sends the first run of each
schedule when it starts (``seed_schedules``), unless one is already queued."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from demo_project.analytics.models import Schedules
from demo_project.analytics.services import aggregate_hour, start_of_hour
from spanner_queues.message import Message
from spanner_queues.monitoring import record_depth_samples
from spanner_queues.patterns import periodic


@periodic(Schedules, every=timedelta(hours=1), key={"name": "hourly-sales"})
def aggregate_hourly_sales(message: Message) -> None:
    """Pattern 7: the hour that just ended, and the current one so far."""
    now = start_of_hour(timezone.now())
    aggregate_hour(now - timedelta(hours=1))
    aggregate_hour(now)


@periodic(Schedules, cron="0 3 * * *", timezone="Europe/Paris", key={"name": "nightly-sales"})
def reaggregate_last_day(message: Message) -> None:
    """Pattern 7 on a cron schedule: at 03:00 Paris time, summer and winter, the 24 hours
    before again (orders that arrived late included)."""
    end = start_of_hour(timezone.now())
    for hours_ago in range(24, 0, -1):
        aggregate_hour(end - timedelta(hours=hours_ago))


@periodic(Schedules, every=timedelta(seconds=10), key={"name": "depth-samples"})
def sample_queue_depths(message: Message) -> None:
    """Keep the admin's depth charts moving while nobody looks at them."""
    record_depth_samples()

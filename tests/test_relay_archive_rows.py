"""The relay's archive rows (``RelayedEvent``) are written as built, in one statement where
the database takes arrays (PostgreSQL), on every database of the suite."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from spanner_queues.drivers import driver_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_archive_rows_are_stored_as_built() -> None:
    relay = pytest.importorskip("spanner_queues.contrib.pubsub.relay")
    from spanner_queues.contrib.pubsub.models import RelayedEvent

    alias = RelayedEvent.objects.db
    connection = connections[alias]
    at = timezone.now() - timedelta(minutes=1)
    data = RelayedEvent._meta.get_field("data")
    published = RelayedEvent._meta.get_field("published_at")
    rows = [
        (
            f"run{i:08x}",
            "app.Queue",
            f"event-{i}",
            f'[{i},"k"]',
            str(i % 2) if i else "",
            data.get_db_prep_save(b'{"n": %d}' % i, connection),
            published.get_db_prep_save(at, connection),
        )
        for i in range(5)
    ]
    with CaptureQueriesContext(connection) as queries, transaction.atomic(using=alias):
        relay._archive(rows, alias)
    inserts = [q for q in queries.captured_queries if "INSERT" in q["sql"].upper()]
    if driver_for(alias).supports_array_parameters:
        assert len(inserts) == 1
    stored = {
        e.event_id: (e.id, e.queue, e.key, e.ordering_key, bytes(e.data), e.published_at)
        for e in RelayedEvent.objects.all()
    }
    assert stored == {
        f"event-{i}": (
            f"run{i:08x}",
            "app.Queue",
            f'[{i},"k"]',
            str(i % 2) if i else "",
            b'{"n": %d}' % i,
            at,
        )
        for i in range(5)
    }

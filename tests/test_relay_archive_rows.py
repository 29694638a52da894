"""The relay's archive rows (``RelayedEvent``) are written as built, in one ``COPY`` where the
driver has it (psycopg 3) or one statement where the database takes arrays (PostgreSQL), on
every database of the suite."""

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
    if driver_for(alias).supports_copy:  # (past Django's cursor wrappers: not captured)
        assert inserts == []
    elif driver_for(alias).supports_array_parameters:
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


def test_the_archive_does_not_index_event_ids() -> None:
    """Random event ids in an index cost every batch of acks a random page an event (the
    relay at 0.8 of a hand-written drainer on SQLite with 80,000 events archived, 1.0
    without); ``pubsubreplay`` finds events by queue and time, then filters."""
    pytest.importorskip("spanner_queues.contrib.pubsub.relay")
    from spanner_queues.contrib.pubsub.models import RelayedEvent

    connection = connections[RelayedEvent.objects.db]
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, RelayedEvent._meta.db_table)
    indexed = [c["columns"] for c in found.values() if c["index"] or c["unique"]]
    assert ["queue", "published_at"] in indexed
    assert not [columns for columns in indexed if "event_id" in columns]

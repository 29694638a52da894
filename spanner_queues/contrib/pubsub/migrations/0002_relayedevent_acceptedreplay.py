from __future__ import annotations

from typing import Any

from django.db import migrations, models

#: Pub/Sub's longest retention, as 0001's policy: the archive's rows expire on Spanner this
#: many days after ``published_at`` (the relay prunes every database to ``ARCHIVE_DAYS``)
POLICY_DAYS = 7


def add_row_deletion_policy(apps: Any, schema_editor: Any) -> None:
    """On Spanner, archived events expire by themselves (a row deletion policy on
    ``published_at``); the relay prunes every database to ``ARCHIVE_DAYS`` as well."""
    if schema_editor.connection.vendor != "spanner":
        return
    table = apps.get_model("spanner_queues_pubsub", "RelayedEvent")._meta.db_table
    schema_editor.execute(
        f"ALTER TABLE {table} ADD ROW DELETION POLICY "
        f"(OLDER_THAN(published_at, INTERVAL {POLICY_DAYS} DAY))"
    )


class Migration(migrations.Migration):
    dependencies = [("spanner_queues_pubsub", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="RelayedEvent",
            fields=[
                ("id", models.CharField(max_length=32, primary_key=True, serialize=False)),
                ("queue", models.CharField(max_length=200)),
                ("event_id", models.CharField(db_index=True, max_length=255)),
                ("key", models.TextField()),
                ("ordering_key", models.CharField(blank=True, default="", max_length=1024)),
                ("data", models.BinaryField()),
                ("published_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "relayed Pub/Sub event",
                "indexes": [
                    models.Index(
                        fields=["queue", "published_at"], name="sq_pubsub_archive_time"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="AcceptedReplay",
            fields=[
                ("id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("inbox", models.CharField(max_length=200)),
                ("replay_id", models.CharField(max_length=100)),
                ("accepted_at", models.DateTimeField()),
            ],
            options={"verbose_name": "accepted Pub/Sub replay"},
        ),
        migrations.RunPython(add_row_deletion_policy, migrations.RunPython.noop, atomic=False),
    ]

from __future__ import annotations

from typing import Any

from django.db import migrations, models

#: Pub/Sub's longest retention: no copy of an event comes back later than this
POLICY_DAYS = 7


def add_row_deletion_policy(apps: Any, schema_editor: Any) -> None:
    """On Spanner, seen ids expire by themselves (a row deletion policy on ``seen_at``); the
    pullers prune every database to ``DEDUP_WINDOW_DAYS`` as well."""
    if schema_editor.connection.vendor != "spanner":
        return
    table = apps.get_model("spanner_queues_pubsub", "SeenEvent")._meta.db_table
    schema_editor.execute(
        f"ALTER TABLE {table} ADD ROW DELETION POLICY "
        f"(OLDER_THAN(seen_at, INTERVAL {POLICY_DAYS} DAY))"
    )


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="SeenEvent",
            fields=[
                ("id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("inbox", models.CharField(max_length=200)),
                ("event_id", models.CharField(max_length=255)),
                ("seen_at", models.DateTimeField(db_index=True)),
            ],
            options={"verbose_name": "seen Pub/Sub event"},
        ),
        migrations.RunPython(add_row_deletion_policy, migrations.RunPython.noop, atomic=False),
    ]

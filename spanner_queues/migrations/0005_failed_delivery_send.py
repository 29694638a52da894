from __future__ import annotations

from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.models import F


def fail_closed(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Records written before 0004 have no ``leased_at``, which read as every message's: a
    message sent again under the key inherited their failures, and the prune never removed
    them. Their latest failed run began before their last update, and so did the message it
    was of: ``updated_at`` keeps that message's count (its ``DeliverTime`` is not later) and
    gives none to a message sent after it (``failures.belongs``)."""
    ledger = apps.get_model("spanner_queues", "FailedDelivery")
    using = schema_editor.connection.alias
    ledger.objects.using(using).filter(leased_at__isnull=True).update(leased_at=F("updated_at"))


class Migration(migrations.Migration):
    """A failure record keeps what identifies its send, whatever Spanner does to
    ``DeliverTime`` on a lease: that lease's expiry, the ``DeliverTime`` seen, an envelope's
    event ``id``; records without ``leased_at`` get one that fails closed."""

    dependencies = [
        ("spanner_queues", "0004_failed_delivery_leased_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="faileddelivery",
            name="deliver_time",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="faileddelivery",
            name="event_id",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.AddField(
            model_name="faileddelivery",
            name="lease_expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(fail_closed, migrations.RunPython.noop, elidable=False),
    ]

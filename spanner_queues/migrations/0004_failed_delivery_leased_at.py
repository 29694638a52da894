from django.db import migrations, models


class Migration(migrations.Migration):
    """A failure record belongs to one sent message: when its failed run's lease began."""

    dependencies = [
        ("spanner_queues", "0003_queue_controls"),
    ]

    operations = [
        migrations.AddField(
            model_name="faileddelivery",
            name="leased_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]

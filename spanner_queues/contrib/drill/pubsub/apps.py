from __future__ import annotations

from django.apps import AppConfig


class DrillPubSubConfig(AppConfig):
    """The Pub/Sub drill's queues: service A's relayed ``DrillEvent`` (and its dead-letter
    queue), service B's inbox ``DrillInbox``; the effects are the drill's ``DrillEffect``."""

    name = "spanner_queues.contrib.drill.pubsub"
    label = "spanner_queues_drill_pubsub"
    verbose_name = "Spanner queues fault drill (Pub/Sub)"
    default_auto_field = "django.db.models.BigAutoField"

from __future__ import annotations

from django.apps import AppConfig

from spanner_queues.contrib.drill import counting


class DrillConfig(AppConfig):
    """The fault drill's queue, effect table and ``queuedrill`` command."""

    name = "spanner_queues.contrib.drill"
    label = "spanner_queues_drill"
    verbose_name = "Spanner queues fault drill"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        counting.install()  # only in the drill's worker processes (SQ_DRILL_WORKER)

"""The conformance suite's app: add ``spanner_queues.testing.conformance`` to INSTALLED_APPS
for a conformance run, never in production (its queues exist only for the suite)."""

from __future__ import annotations

from django.apps import AppConfig


class ConformanceConfig(AppConfig):
    name = "spanner_queues.testing.conformance"
    label = "spanner_queues_conformance"
    verbose_name = "spanner_queues conformance suite"
    default_auto_field = "django.db.models.BigAutoField"

"""Queues, a model and receivers of the tracing and envelope tests (``tests/tracing``)."""

from __future__ import annotations

from django.apps import AppConfig


class TracingAppConfig(AppConfig):
    name = "tests.tracingapp"
    label = "tracingapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from spanner_queues import outbox
        from tests.tracingapp.models import Order

        outbox.register(Order, queue="tracingapp.OrderEvents", fields=("total",))

from __future__ import annotations

from django.apps import AppConfig

from spanner_queues import instrumentation
from spanner_queues.contrib.tracing.otel import QueueTracing


class TracingConfig(AppConfig):
    """Installs ``QueueTracing`` as the process's instrumentation
    (``spanner_queues.instrumentation``) when Django starts."""

    name = "spanner_queues.contrib.tracing"
    label = "spanner_queues_tracing"
    verbose_name = "Spanner queues tracing"

    def ready(self) -> None:
        instrumentation.install(QueueTracing())

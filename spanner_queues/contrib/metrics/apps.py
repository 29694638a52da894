from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.apps import AppConfig
from django.core import checks

from spanner_queues.contrib.metrics.conf import check_setting, metrics_params
from spanner_queues.contrib.metrics.exporter import WorkerMetrics, enable, wsgi_app
from spanner_queues.exceptions import QueueError

if TYPE_CHECKING:
    from spanner_queues.contrib.metrics.sampler import Sampler
    from spanner_queues.worker import WorkerEvent


class MetricsConfig(AppConfig):
    """Prometheus metrics: checks ``SPANNER_QUEUES_METRICS`` (E201), counts from the start in
    web processes with ``VIEW`` on, and gives ``runqueueworker --metrics-port`` what it serves
    (``worker_metrics``)."""

    name = "spanner_queues.contrib.metrics"
    label = "spanner_queues_metrics"
    verbose_name = "Spanner queues metrics"

    def ready(self) -> None:
        checks.register(check_setting)
        try:
            view = metrics_params().view
        except QueueError:
            return  # a wrong setting is E201's to report: never a start-up traceback
        if view:
            enable()  # every web process counts from its start, not from its first scrape

    def worker_metrics(
        self, interval: float | None = None
    ) -> tuple[Any, Callable[[WorkerEvent], None], Sampler]:
        """What a worker serving metrics runs (``runqueueworker --metrics-port``): the WSGI
        app of ``/metrics`` (metrics switched on), a ``WorkerMetrics`` listener, and a
        ``Sampler`` (not started) every ``interval`` seconds (default
        ``SAMPLE_INTERVAL_SECONDS``), storing depth samples unless ``RECORD_DEPTH_SAMPLES`` is
        off. ``InvalidQueueEngine`` for a wrong ``SPANNER_QUEUES_METRICS``."""
        from spanner_queues.contrib.metrics.sampler import Sampler  # (it needs the models)

        params = metrics_params()
        sampler = Sampler(interval or params.sample_interval, record=params.record_depth_samples)
        return wsgi_app(), WorkerMetrics(), sampler

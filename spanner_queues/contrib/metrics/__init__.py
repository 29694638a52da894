"""Prometheus metrics for spanner_queues: an optional app (label ``spanner_queues_metrics``).

    pip install 'spanner-queues[metrics]'
    INSTALLED_APPS += ["spanner_queues.contrib.metrics"]

Then ``runqueueworker --metrics-port`` serves ``/metrics``, and with
``SPANNER_QUEUES_METRICS = {"VIEW": True, ...}`` ``metrics_view`` serves a web process's counts
(see ``docs/howto/metrics.md``). It counts the verbs' sends and acks through their signals
(``spanner_queues.signals``, sent on commit) and the worker's events through ``WorkerMetrics``,
a ``Worker`` listener. ``SPANNER_QUEUES_METRICS`` or ``--metrics-port`` without the app in
``INSTALLED_APPS`` is the system check error ``spanner_queues.E203`` and a command error; the
app without prometheus-client raises ``MetricsUnavailable`` at start-up, naming the extra.

The public names, all from here::

    from spanner_queues.contrib.metrics import metrics_view, enable, WorkerMetrics
"""

from __future__ import annotations

from spanner_queues.contrib.metrics.conf import MetricsUnavailable
from spanner_queues.contrib.metrics.exporter import (
    METRIC_NAMES,
    QueueGauges,
    WorkerMetrics,
    enable,
    enabled,
    metrics_view,
    serve,
    wsgi_app,
)

__all__ = [
    "METRIC_NAMES",
    "MetricsUnavailable",
    "QueueGauges",
    "WorkerMetrics",
    "enable",
    "enabled",
    "metrics_view",
    "serve",
    "wsgi_app",
]

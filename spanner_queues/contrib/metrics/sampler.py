"""The ``Sampler`` thread ``runqueueworker --metrics-port`` runs beside the worker: it refreshes
the queue gauges and stores the admin's depth samples.

Imported once the models are loaded (``monitoring`` writes ``QueueDepthSample`` rows), by
``MetricsConfig.worker_metrics``: not by the package, nor by ``apps.py`` at its top.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from django.db import connections

from spanner_queues.contrib.metrics.exporter import gauges
from spanner_queues.monitoring import record_depth_samples

__all__ = ["Sampler"]

logger = logging.getLogger("spanner_queues.contrib.metrics")


class Sampler(threading.Thread):
    """Every ``interval`` seconds: refresh the queue gauges and, with ``record``, store depth
    samples for the admin's chart (``record_depth_samples``; a queue sampled less than
    ``interval`` ago by another worker is skipped). Database errors are logged, never
    raised."""

    def __init__(self, interval: float, *, record: bool = True) -> None:
        super().__init__(name="spanner_queues-metrics-sampler", daemon=True)
        self.interval = interval
        self.record = record
        self.samples = 0
        self._stop_event = threading.Event()
        self._gauges = gauges()

    def run(self) -> None:
        try:
            while True:
                try:
                    # (a queue read within most of the interval, e.g. for the summary line,
                    # is not read again)
                    measured = self._gauges.refresh(max_age=self.interval * 0.9)
                    if self.record and measured:
                        record_depth_samples(
                            min_interval=timedelta(seconds=self.interval * 0.9), stats=measured
                        )
                except Exception:
                    logger.exception("queue metrics: sampling failed; trying again")
                finally:
                    for conn in connections.all(initialized_only=True):
                        conn.close_if_unusable_or_obsolete()
                self.samples += 1
                if self._stop_event.wait(self.interval):
                    return
        finally:
            connections.close_all()

    def stop(self) -> None:
        self._stop_event.set()

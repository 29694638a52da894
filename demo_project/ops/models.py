"""Worker heartbeats (pattern 10) and the alerts they raise."""

from __future__ import annotations

import json

from django.db import models

from spanner_queues.models import Queue


class WorkerHeartbeats(Queue):
    """One message per live worker, always due ``TIMEOUT`` ahead and replaced every
    ``BEAT_EVERY``. It is delivered only when its worker stopped beating: that is the alert."""

    worker_id = models.CharField(max_length=100, primary_key=True)

    class Meta:
        verbose_name_plural = "worker heartbeats"


def is_simulated(info: str) -> bool:
    """Whether a heartbeat's payload (JSON text) marks a worker the demo simulates dying."""
    try:
        beat = json.loads(info) if info else {}
    except ValueError:
        return False
    return isinstance(beat, dict) and "simulated" in beat


class WorkerAlert(models.Model):
    worker_id = models.CharField(max_length=100)
    last_beat_at = models.DateTimeField(null=True, blank=True)
    detected_at = models.DateTimeField(auto_now_add=True)
    #: the last heartbeat's payload (JSON text: django-google-spanner cannot insert into JSON
    #: columns on the emulator)
    info = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.worker_id} stopped beating" + (" (simulated)" if self.simulated else "")

    @property
    def simulated(self) -> bool:
        """A worker the demo's traffic generator started to die (its beat says so)."""
        return is_simulated(self.info)

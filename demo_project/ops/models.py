"""Worker heartbeats (pattern 10) and the alerts they raise."""

from __future__ import annotations

from django.db import models

from spanner_queues.models import Queue


class WorkerHeartbeats(Queue):
    """One message per live worker, always due ``TIMEOUT`` ahead and replaced every
    ``BEAT_EVERY``. It is delivered only when its worker stopped beating: that is the alert."""

    worker_id = models.CharField(max_length=100, primary_key=True)

    class Meta:
        verbose_name_plural = "worker heartbeats"


class WorkerAlert(models.Model):
    worker_id = models.CharField(max_length=100)
    last_beat_at = models.DateTimeField(null=True, blank=True)
    detected_at = models.DateTimeField(auto_now_add=True)
    #: the last heartbeat's payload (JSON text: django-google-spanner cannot insert into JSON
    #: columns on the emulator)
    info = models.TextField(blank=True)

    def __str__(self) -> str:
        return f"{self.worker_id} stopped beating"

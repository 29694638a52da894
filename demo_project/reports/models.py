"""Reports and their job queue."""

from __future__ import annotations

import json
from typing import Any

from django.db import models

from spanner_queues.models import Queue


class Report(models.Model):
    KINDS = [("sales_export", "Sales export"), ("ledger_audit", "Ledger audit")]

    kind = models.CharField(max_length=32, choices=KINDS)
    status = models.CharField(max_length=16, default="queued")
    rows_total = models.PositiveIntegerField(default=0)
    rows_done = models.PositiveIntegerField(default=0)
    #: the job's state between checkpoints (ledger audit), then its result, as JSON text
    #: (a TextField: django-google-spanner cannot insert into JSON columns on the emulator)
    state_json = models.TextField(default="{}", blank=True)
    checkpoints = models.PositiveIntegerField(default=0)
    deliveries = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.get_kind_display()} #{self.pk}"

    @property
    def state(self) -> dict[str, Any]:
        return json.loads(self.state_json or "{}")

    @state.setter
    def state(self, value: dict[str, Any]) -> None:
        self.state_json = json.dumps(value)


class ReportJobs(Queue):
    """Slow work gets its own queue, so that it never starves the quick order tasks. The
    payload's ``kind`` chooses the receiver (``match=`` on a payload field)."""

    report_id = models.BigIntegerField(primary_key=True)

    class Meta:
        verbose_name_plural = "report jobs"

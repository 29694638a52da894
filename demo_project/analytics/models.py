"""Hourly aggregates and the queue that schedules the periodic jobs."""

from __future__ import annotations

from django.db import models

from spanner_queues.models import Queue


class HourlySales(models.Model):
    """Orders, revenue and sign-ups of one hour (recomputed by the hourly job)."""

    hour = models.DateTimeField(unique=True)
    orders = models.PositiveIntegerField(default=0)
    revenue_cents = models.PositiveIntegerField(default=0)
    signups = models.PositiveIntegerField(default=0)
    computed_at = models.DateTimeField()

    class Meta:
        verbose_name_plural = "hourly sales"
        ordering = ["-hour"]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H:00}"


class Schedules(Queue):
    """Pattern 7 (periodic work): one message per schedule, keyed by its name. Each run acks
    its message and sends the next one, in one transaction."""

    name = models.CharField(max_length=64, primary_key=True)

    class Meta:
        verbose_name_plural = "schedules"

"""Aggregating one hour."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.contrib.auth.models import User
from django.db.models import Count, Sum
from django.utils import timezone

from demo_project.analytics.models import HourlySales
from demo_project.shop.models import Order


def aggregate_hour(hour: datetime) -> HourlySales:
    """(Re)compute the figures of the hour starting at ``hour``; idempotent."""
    end = hour + timedelta(hours=1)
    orders = Order.objects.filter(created_at__gte=hour, created_at__lt=end).aggregate(
        n=Count("id"), revenue=Sum("amount_cents")
    )
    signups = User.objects.filter(date_joined__gte=hour, date_joined__lt=end).count()
    row, _ = HourlySales.objects.update_or_create(
        hour=hour,
        defaults={
            "orders": orders["n"],
            "revenue_cents": orders["revenue"] or 0,
            "signups": signups,
            "computed_at": timezone.now(),
        },
    )
    return row


def start_of_hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)

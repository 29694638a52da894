"""Hourly aggregates computed by a periodic job."""

from __future__ import annotations

from django.apps import AppConfig


class AnalyticsConfig(AppConfig):
    name = "demo_project.analytics"
    label = "analytics"

"""Long reports: lease renewal and checkpoints."""

from __future__ import annotations

from django.apps import AppConfig


class ReportsConfig(AppConfig):
    name = "demo_project.reports"
    label = "reports"

"""Worker heartbeats and timeout alerts; the worker command with a heartbeat."""

from __future__ import annotations

from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "demo_project.ops"
    label = "ops"

"""The demo runner and its traffic generator."""

from __future__ import annotations

from django.apps import AppConfig


class TrafficConfig(AppConfig):
    name = "demo_project.traffic"
    label = "traffic"

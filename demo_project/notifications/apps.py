"""Notifications batched into one digest email per user and time window."""

from __future__ import annotations

from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "demo_project.notifications"
    label = "notifications"

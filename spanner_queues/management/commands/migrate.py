"""``migrate`` with the same autodetector as ``makemigrations`` (Django requires them equal)."""

from __future__ import annotations

from django.core.management.commands.migrate import Command as MigrateCommand

from spanner_queues.autodetector import QueueAutodetector


class Command(MigrateCommand):
    autodetector = QueueAutodetector

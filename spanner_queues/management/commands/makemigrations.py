"""``makemigrations`` that writes ``CreateQueue``/``DeleteQueue`` for ``Queue`` models."""

from __future__ import annotations

from django.core.management.commands.makemigrations import Command as MakeMigrationsCommand

from spanner_queues.autodetector import QueueAutodetector


class Command(MakeMigrationsCommand):
    autodetector = QueueAutodetector

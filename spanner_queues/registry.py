"""Declared queues: every concrete ``Queue`` subclass of an installed app."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import apps

from spanner_queues.exceptions import UnknownQueue
from spanner_queues.options import queue_options

if TYPE_CHECKING:
    from spanner_queues.engines.base import BaseQueueEngine
    from spanner_queues.models import Queue


def queue_models() -> list[type[Queue]]:
    """All declared queues, in app order."""
    from spanner_queues.models import Queue

    return [m for m in apps.get_models() if issubclass(m, Queue)]


def get_queue(queue: str | type[Queue]) -> type[Queue]:
    """Resolve a queue model from itself, its label (``"app.Model"``, case-insensitive), its
    model name when unambiguous, or its table name. Raise ``UnknownQueue`` otherwise."""
    from spanner_queues.models import Queue

    if isinstance(queue, type):
        if issubclass(queue, Queue) and not queue._meta.abstract:
            return queue
        raise UnknownQueue(f"{queue!r} is not a concrete Queue model.")
    wanted = str(queue).lower()
    models = queue_models()
    for model in models:
        if wanted in (model._meta.label_lower, model._meta.db_table.lower()):
            return model
    by_name = [m for m in models if m._meta.model_name == wanted]
    if len(by_name) == 1:
        return by_name[0]
    known = ", ".join(m._meta.label for m in models) or "none"
    raise UnknownQueue(f"No queue named {queue!r}. Declared queues: {known}.")


def engine_for(model: type[Queue]) -> BaseQueueEngine:
    """The engine the queue's ``QueueMeta.engine`` alias names."""
    from spanner_queues.engines import engines

    return engines[queue_options(model).engine]

"""Declared queues: every concrete ``Queue`` subclass of an installed app (``queue_models``)
and the lookup of one by model or name (``get_queue``); a queue's engine is
``spanner_queues.engines.engine_for``. Imports no model module: a queue is recognised by its
metaclass (``spanner_queues.storage.QueueBase``), so ``spanner_queues.models`` may call the
verbs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.apps import apps

from spanner_queues.exceptions import UnknownQueue
from spanner_queues.storage import is_queue

if TYPE_CHECKING:
    from spanner_queues.models import Queue

__all__ = ["get_queue", "queue_models"]


def queue_models() -> list[type[Queue]]:
    """All declared queues, in app order."""
    return [m for m in apps.get_models() if is_queue(m)]


def get_queue(queue: str | type[Queue]) -> type[Queue]:
    """Resolve a queue model from itself, its label (``"app.Model"``, case-insensitive), its
    model name when unambiguous, or its table name. Raise ``UnknownQueue`` otherwise."""
    if isinstance(queue, type):
        if is_queue(queue):
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

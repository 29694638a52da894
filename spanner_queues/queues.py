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


#: the queues of the app registry's model list they were found in (``apps.get_models()`` is
#: cached by the registry and replaced when models change: a new list, a new scan)
_found: tuple[object, list[type[Queue]], dict[str, type[Queue]]] | None = None


def _declared() -> tuple[list[type[Queue]], dict[str, type[Queue]]]:
    """The declared queues and the names they resolve by (label and table, lower-cased),
    found once per state of the app registry."""
    global _found
    models = apps.get_models()
    found = _found
    if found is None or found[0] is not models:
        queues = [m for m in models if is_queue(m)]
        names: dict[str, type[Queue]] = {}
        for m in reversed(queues):  # (the first in app order wins, as a scan would find)
            names[m._meta.db_table.lower()] = m
            names[m._meta.label_lower] = m
        found = _found = (models, queues, names)
    return found[1], found[2]


def queue_models() -> list[type[Queue]]:
    """All declared queues, in app order."""
    return list(_declared()[0])


def get_queue(queue: str | type[Queue]) -> type[Queue]:
    """Resolve a queue model from itself, its label (``"app.Model"``, case-insensitive), its
    model name when unambiguous, or its table name. Raise ``UnknownQueue`` otherwise."""
    if isinstance(queue, type):
        if is_queue(queue):
            return queue
        raise UnknownQueue(f"{queue!r} is not a concrete Queue model.")
    wanted = str(queue).lower()
    models, names = _declared()
    found = names.get(wanted)
    if found is not None:
        return found
    by_name = [m for m in models if m._meta.model_name == wanted]
    if len(by_name) == 1:
        return by_name[0]
    known = ", ".join(m._meta.label for m in models) or "none"
    raise UnknownQueue(f"No queue named {queue!r}. Declared queues: {known}.")

"""Per-queue declaration options, read from a queue model's ``QueueMeta`` inner class.

class ImageTasks(Queue):
    upload = models.ForeignKey(ImageUpload, on_delete=models.CASCADE, db_column="id")
    message_id = models.CharField(max_length=64)
    pk = models.CompositePrimaryKey("upload", "message_id")

    class QueueMeta:
        engine = "default"                 # alias in SPANNER_QUEUES
        interleave_in_parent = "upload"    # INTERLEAVE IN PARENT ... ON DELETE CASCADE
        native_options = {"receive_mode": "PULL"}   # CREATE QUEUE ... OPTIONS (...)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spanner_queues.conf import DEFAULT_ENGINE_ALIAS

if TYPE_CHECKING:
    from django.db import models

KNOWN_OPTIONS = frozenset(
    {
        "engine",
        "interleave_in_parent",
        "native_options",
        "max_attempts",
        "dead_letter_queue",
        "discard_after_max_attempts",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueOptions:
    engine: str = DEFAULT_ENGINE_ALIAS
    interleave_in_parent: str | None = None
    native_options: Mapping[str, Any] = field(default_factory=dict)
    #: deliveries after which a failing message leaves the queue (None: never, like Spanner).
    max_attempts: int | None = None
    #: label of the queue that receives messages past ``max_attempts``.
    dead_letter_queue: str | None = None
    #: with ``max_attempts`` and no dead-letter queue: drop such messages (logged as errors).
    discard_after_max_attempts: bool = False


@functools.cache
def queue_options(model: type[models.Model]) -> QueueOptions:
    """The model's ``QueueMeta`` options (cached per class: declarations do not change)."""
    meta = getattr(model, "QueueMeta", None)
    if meta is None:
        return QueueOptions()
    values = {name: getattr(meta, name) for name in dir(meta) if not name.startswith("_")}
    return QueueOptions(**{k: v for k, v in values.items() if k in KNOWN_OPTIONS})


def unknown_options(model: type[models.Model]) -> list[str]:
    meta = getattr(model, "QueueMeta", None)
    if meta is None:
        return []
    return sorted(n for n in dir(meta) if not n.startswith("_") and n not in KNOWN_OPTIONS)

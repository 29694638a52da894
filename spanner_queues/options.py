"""Per-queue declaration options, read from a queue model's ``QueueMeta`` inner class.

class ImageTasks(Queue):
    upload = models.ForeignKey(ImageUpload, on_delete=models.CASCADE, db_column="id")
    message_id = models.CharField(max_length=64)
    pk = models.CompositePrimaryKey("upload", "message_id")

    class QueueMeta:
        engine = "default"                 # alias in SPANNER_QUEUES
        interleave_in_parent = "upload"    # INTERLEAVE IN PARENT ... ON DELETE CASCADE
        native_options = {"receive_mode": "PULL"}   # CREATE QUEUE ... OPTIONS (...)
        # native queues: , ROW DELETION POLICY (OLDER_THAN(DeliverTime, INTERVAL 30 DAY))
        row_deletion_policy = {"older_than": "deliver_time", "days": 30}
        payload_type = "json"              # "bytes" (default), "string" or "json"
        concurrency_limit = 2              # at most 2 of its messages per worker process
        rate_limit = 10                    # at most 10 starts per second, all workers together
        # with the app spanner_queues.contrib.pubsub (docs/howto/pubsub.md):
        pubsub_topic = "orders"            # relayed: runqueueworker publishes each message there
        pubsub_subscription = "orders-billing"  # an inbox: runqueueworker pulls it into the queue
        envelope = "cloudevents"           # store CloudEvents 1.0 JSON around the payload
        group_size = 20                    # at most 20 messages per commit (1: each alone)
        group_ms = 50                      # ... or 50 ms of receiver time, whichever first
        ordered_by = ("upload",)           # one message of an upload at a time, in send order
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spanner_queues.conf import DEFAULT_ENGINE_ALIAS
from spanner_queues.exceptions import QueueConfigurationError
from spanner_queues.keys import key_fields

if TYPE_CHECKING:
    from django.db import models

#: the rates ``QueueMeta.rate_limit`` may have (E020): one start a day, below a million a second
MIN_RATE_LIMIT = 1 / 86400
MAX_RATE_LIMIT = 1e6

KNOWN_OPTIONS = frozenset(
    {
        "engine",
        "interleave_in_parent",
        "native_options",
        "max_attempts",
        "dead_letter_queue",
        "discard_after_max_attempts",
        "row_deletion_policy",
        "payload_type",
        "concurrency_limit",
        "rate_limit",
        "pubsub_topic",
        "pubsub_ordering_key",
        "ordered_by",
        "pubsub_subscription",
        "envelope",
        "group_size",
        "group_ms",
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
    #: ``{"older_than": <field>, "days": n}``: Spanner's TTL on native queues (see
    #: ``row_deletion``); the table engine keeps messages until they are acked.
    row_deletion_policy: Mapping[str, Any] | None = None
    #: "bytes", "string" or "json": the ``payload`` field the queue gets (None: as declared,
    #: bytes unless the model declares its own ``payload`` field).
    payload_type: str | None = None
    #: most of this queue's messages one worker process holds (running or waiting) at once
    #: (None: only the worker's own slots limit it)
    concurrency_limit: int | None = None
    #: messages per second this queue's receivers may start, shared by every worker (None: no
    #: limit); bursts of up to one second's worth (``spanner_queues.controls.take_starts``);
    #: from ``MIN_RATE_LIMIT`` (one a day) to below ``MAX_RATE_LIMIT`` (E020)
    rate_limit: float | None = None
    #: with ``spanner_queues.contrib.pubsub``: the Pub/Sub topic (an id in the configured
    #: project, or ``projects/P/topics/T``) each message is published to by ``runqueueworker``
    pubsub_topic: str | None = None
    #: the key fields whose values make a relayed message's ordering key (None: the
    #: ``ordered_by`` fields, else every key field but the last when the key has several,
    #: none for a one-field key; ``()``: none)
    pubsub_ordering_key: tuple[str, ...] | None = None
    #: the key fields (a proper prefix of the key) whose values make a message's ordering
    #: key: each ordering key's messages are delivered one at a time in send order
    #: (``spanner_queues.ordering``; None: no order)
    ordered_by: tuple[str, ...] | None = None
    #: with ``spanner_queues.contrib.pubsub``: the Pub/Sub subscription (an id in the
    #: configured project, or ``projects/P/subscriptions/S``) ``runqueueworker`` pulls into
    #: this queue (an inbox: one string key field, the event id)
    pubsub_subscription: str | None = None
    #: "cloudevents": each message is stored as a CloudEvents 1.0 JSON event around its payload
    #: (``spanner_queues.envelope``); None: the raw payload
    envelope: str | None = None
    #: most messages the worker runs in one transaction with one commit (``worker.group``;
    #: 1: each alone; None: the worker's ``--group-size``)
    group_size: int | None = None
    #: milliseconds of receiver time after which a group commits (None: the worker's
    #: ``--group-ms``)
    group_ms: float | None = None


@dataclass(frozen=True, slots=True)
class RowDeletion:
    """A validated ``row_deletion_policy``: rows older than ``days`` after ``column`` go
    (``column`` None: the queue's ``DeliverTime``)."""

    column: str | None
    days: int


_POLICY_KEYS = frozenset({"older_than", "days"})


def row_deletion(model: type[models.Model], options: QueueOptions) -> RowDeletion | None:
    """The queue's ``row_deletion_policy``, validated; ``QueueConfigurationError`` says why
    it is unusable. ``older_than`` names ``deliver_time`` or a ``DateTimeField`` key field."""

    policy = options.row_deletion_policy
    if policy is None:
        return None
    prefix = f"{model._meta.label}: QueueMeta.row_deletion_policy"
    if not isinstance(policy, Mapping):
        raise QueueConfigurationError(
            f"{prefix} must be a dict like {{'older_than': 'deliver_time', 'days': 30}}."
        )
    wrong = sorted(set(policy) ^ _POLICY_KEYS)
    if wrong:
        raise QueueConfigurationError(
            f"{prefix} needs exactly the keys 'older_than' and 'days' (check {wrong!r})."
        )
    days = policy["days"]
    if isinstance(days, bool) or not isinstance(days, int) or days < 0:
        raise QueueConfigurationError(f"{prefix}: days must be a non-negative int, not {days!r}.")
    name = policy["older_than"]
    if name == "deliver_time":
        return RowDeletion(column=None, days=days)
    field = next((f for f in key_fields(model) if name in (f.name, f.attname)), None)
    if field is None or field.get_internal_type() != "DateTimeField":
        raise QueueConfigurationError(
            f"{prefix}: older_than = {name!r} must be 'deliver_time' or a DateTimeField key "
            "field (Spanner's TTL needs a timestamp column of the queue)."
        )
    return RowDeletion(column=field.column, days=days)


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


def ordered_by(model: type[models.Model]) -> tuple[str, ...]:
    """The attnames of the key fields that make a message's ordering key (``()``: the queue
    is not ordered). ``QueueMeta.ordered_by`` names fields by name or attname."""
    declared = queue_options(model).ordered_by
    if not declared:
        return ()
    by_name = {}
    for f in key_fields(model):
        by_name[f.name] = by_name[f.attname] = f.attname
    return tuple(by_name[n] for n in declared)


def ordered_by_problems(model: type[models.Model]) -> list[str]:
    """What is wrong with ``QueueMeta.ordered_by`` (E021); empty when it is fine or absent."""
    declared = queue_options(model).ordered_by
    if declared is None:
        return []
    fields = key_fields(model)
    names = [f.name for f in fields]
    if (
        isinstance(declared, str)
        or not isinstance(declared, (tuple, list))
        or not declared
        or not all(isinstance(n, str) for n in declared)
    ):
        return [
            f"QueueMeta.ordered_by must be a non-empty tuple of key field names (e.g. "
            f"({names[0]!r},)), not {declared!r}."
        ]
    wanted = [f.name for f in fields[: len(declared)]]
    given = [next((f.name for f in fields if n in (f.name, f.attname)), n) for n in declared]
    if len(declared) >= len(fields) or given != wanted:
        return [
            f"QueueMeta.ordered_by = {tuple(declared)!r} must name the first key fields of "
            f"the queue, a proper prefix of its key {tuple(names)!r} (the rest of the key "
            "names one message of the ordering key)."
        ]
    return []

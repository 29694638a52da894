"""Outbox registrations: one ``Registration`` per ``register()`` call (which events of a model
send to which queue, and how the message is built), the store of them by concrete model, and
the two steps every path shares: the transaction guard and the send itself."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.db import connections, router, transaction
from django.db.models import Field, Model

from spanner_queues.api import build_message, send_outgoing
from spanner_queues.exceptions import (
    InvalidMessage,
    PayloadError,
    QueueConfigurationError,
    QueueError,
    TransactionRequired,
)
from spanner_queues.outbox.builders import default_key_builder, field_value, jsonable, trackable
from spanner_queues.registry import engine_for, get_queue

if TYPE_CHECKING:
    from spanner_queues.message import OutgoingMessage
    from spanner_queues.models import Queue

#: The model events a registration can listen to.
EVENTS = ("created", "updated", "deleted")

#: ``key(instance, event=..., changed=...) -> {queue key field: value}``
KeyBuilder = Callable[..., Mapping[str, Any]]
#: ``payload(instance, event=..., changed=...) -> bytes | str | JSON-serialisable``
PayloadBuilder = Callable[..., Any]

#: concrete model -> its registrations (mutated in place, never rebound)
registered: dict[type[Model], list[Registration]] = {}


class Registration:
    """One ``register()`` call: which events of ``model`` send to which queue, and how."""

    def __init__(
        self,
        model: type[Model],
        *,
        queue: str | type[Queue],
        on: frozenset[str],
        fields: tuple[Field, ...] | None,
        key: KeyBuilder | None,
        payload: PayloadBuilder | None,
    ) -> None:
        self.model = model
        self.queue = queue
        self.on = on
        self.explicit_fields = fields is not None
        self.fields: tuple[Field, ...] = fields if fields is not None else trackable(model)
        self.field_names = frozenset(f.name for f in self.fields)
        self.key = key
        self.payload = payload
        self._queue_model: type[Queue] | None = None
        self._default_key: Callable[[Model], dict[str, Any]] | None = None

    def __repr__(self) -> str:
        return (
            f"<outbox.Registration {self.model._meta.label} -> {self.queue_label} "
            f"on {sorted(self.on)}>"
        )

    @property
    def queue_label(self) -> str:
        if isinstance(self.queue, str):
            return self.queue
        return self.queue._meta.label

    def queue_model(self) -> type[Queue]:
        """The queue model, resolved and checked once (queue labels need the app registry)."""
        if self._queue_model is None:
            model = get_queue(self.queue)
            self._default_key = None if self.key else default_key_builder(self, model)
            self._queue_model = model
        return self._queue_model

    def names_of(self, names: Iterable[str]) -> frozenset[str]:
        """Field names for ``names``, which may use attnames (``author_id``)."""
        by_attname = {f.attname: f.name for f in self.model._meta.concrete_fields}
        return frozenset(by_attname.get(n, n) for n in names)

    def fires(self, event: str, changed: frozenset[str] | None) -> bool:
        """Whether this registration sends a message for ``event``. ``changed`` holds the
        names of the fields an update changed (``None``: unknown, counts as a change)."""
        if event not in self.on:
            return False
        if event != "updated" or changed is None:
            return True
        return bool(changed & self.field_names)

    def build(self, instance: Model, event: str, changed: frozenset[str]) -> dict[str, Any]:
        """The ``send_many`` spec for one message, validated and with its payload encoded.

        Raises ``PayloadError`` or ``InvalidMessage`` naming the registration; nothing is
        written here.
        """
        outgoing = self.build_outgoing(instance, event, changed)
        return {**outgoing.key, "payload": outgoing.payload}

    def build_outgoing(
        self, instance: Model, event: str, changed: frozenset[str]
    ) -> OutgoingMessage:
        """``build`` as the validated message ``send_specs`` writes without validating it
        again."""
        queue = self.queue_model()
        changed = changed & self.field_names
        where = f"outbox {self.model._meta.label} {event} -> {queue._meta.label}"
        try:
            if self.key is not None:
                key = dict(self.key(instance, event=event, changed=changed))
            else:
                assert self._default_key is not None
                key = self._default_key(instance)
        except Exception as exc:
            raise InvalidMessage(
                f"{where}: the key builder raised {type(exc).__name__}: {exc}. "
                "The save or delete was aborted."
            ) from exc
        try:
            if self.payload is not None:
                payload = self.payload(instance, event=event, changed=changed)
            else:
                payload = self.default_payload(instance, event, changed)
        except Exception as exc:
            raise PayloadError(
                f"{where}: the payload builder raised {type(exc).__name__}: {exc}. "
                "The save or delete was aborted."
            ) from exc
        if "payload" in key or "deliver_time" in key or "delay" in key:
            raise InvalidMessage(f"{where}: the key builder returned non-key entries.")
        try:
            return build_message(queue, {**key, "payload": payload})
        except QueueError as exc:
            raise type(exc)(f"{where}: {exc} The save or delete was aborted.") from exc

    def default_payload(
        self, instance: Model, event: str, changed: frozenset[str]
    ) -> dict[str, Any]:
        """``{"model", "pk", "event"}``, plus ``"changed"`` (field names) for updates and, for
        deletes of a registration with explicit ``fields``, ``"data"``: those fields' values
        (the row is gone when the receiver runs)."""
        document: dict[str, Any] = {
            "model": self.model._meta.label_lower,
            "pk": jsonable(instance.pk),
            "event": event,
        }
        if event == "updated":
            document["changed"] = sorted(changed)
        if event == "deleted" and self.explicit_fields:
            document["data"] = {f.name: field_value(f, instance) for f in self.fields}
        return document  # encoded like every payload: the engine's JSON_ENCODER


def registrations(model: type[Model] | None = None) -> list[Registration]:
    """The registrations of ``model`` (its concrete model), or all of them."""
    if model is None:
        return [r for regs in registered.values() for r in regs]
    return list(registered.get(model._meta.concrete_model or model, []))


def send_specs(specs: list[tuple[Registration, OutgoingMessage]], using: str) -> None:
    """Write the messages ``build_outgoing`` made (validated then), one INSERT per queue."""
    if len(specs) == 1:
        registration, outgoing = specs[0]
        send_outgoing(registration.queue_model(), [outgoing], using=using)
        return
    by_queue: dict[str, tuple[type[Queue], list[OutgoingMessage]]] = {}
    for registration, outgoing in specs:
        queue = registration.queue_model()
        by_queue.setdefault(queue._meta.label, (queue, []))[1].append(outgoing)
    for queue, batch in by_queue.values():
        send_outgoing(queue, batch, using=using)


def poison(using: str) -> None:
    """Mark the caller's transaction for rollback: part of it (the row) may be written."""
    if connections[using].in_atomic_block:
        transaction.set_rollback(True, using=using)


def require_transaction(registration: Registration, using: str, what: str) -> None:
    """Raise ``TransactionRequired`` (before anything is written) unless ``using`` is in a
    transaction, and refuse a queue that lives on another database."""
    queue = registration.queue_model()
    queue_db = engine_for(queue).database or router.db_for_write(queue)
    if queue_db != using:
        raise QueueConfigurationError(
            f"outbox: {registration.model._meta.label} is written to database {using!r} but "
            f"queue {queue._meta.label} lives in {queue_db!r}; a message can only share the "
            "transaction of a row in the same database."
        )
    connection = connections[using]
    if connection.in_atomic_block or not connection.get_autocommit():
        return
    raise TransactionRequired(
        f"{what} outside transaction.atomic(using={using!r}) would commit the row before its "
        f"outbox message for queue {queue._meta.label} could be written in the same "
        f"transaction. Wrap it: `with transaction.atomic(using={using!r}): ...` (admin views "
        "and loaddata already do; ATOMIC_REQUESTS=True covers views). Nothing was written."
    )

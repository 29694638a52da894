"""``register`` and ``unregister``: declare which model events send to which queue; the signal
receivers are (re)connected to match."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeVar, overload

from django.apps import apps
from django.db.models import Model

from spanner_queues.exceptions import QueueConfigurationError
from spanner_queues.outbox.builders import resolve_fields
from spanner_queues.outbox.registration import (
    EVENTS,
    KeyBuilder,
    PayloadBuilder,
    Registration,
    registered,
)
from spanner_queues.outbox.signals import connect

if TYPE_CHECKING:
    from spanner_queues.models import Queue

M = TypeVar("M", bound=type[Model])


@overload
def register(
    model: M,
    *,
    queue: str | type[Queue],
    on: str | Iterable[str] = EVENTS,
    fields: Iterable[str] | None = None,
    key: KeyBuilder | None = None,
    payload: PayloadBuilder | None = None,
) -> M: ...


@overload
def register(
    model: None = None,
    *,
    queue: str | type[Queue],
    on: str | Iterable[str] = EVENTS,
    fields: Iterable[str] | None = None,
    key: KeyBuilder | None = None,
    payload: PayloadBuilder | None = None,
) -> Callable[[M], M]: ...


def register(
    model: M | None = None,
    *,
    queue: str | type[Queue],
    on: str | Iterable[str] = EVENTS,
    fields: Iterable[str] | None = None,
    key: KeyBuilder | None = None,
    payload: PayloadBuilder | None = None,
) -> M | Callable[[M], M]:
    """Send a message to ``queue`` whenever ``model`` is created, updated or deleted.

    - ``on``: any of ``"created"``, ``"updated"``, ``"deleted"`` (default: all three).
    - ``fields``: the field names whose change counts as an update (default: every concrete
      field). With explicit ``fields``, the default delete payload carries their values.
    - ``key(instance, event=, changed=)``: the message key as ``{field: value}``. Default: the
      model's primary key in the queue's leading key field(s) and a fresh ``uuid4().hex`` in the
      last one (so a queue interleaved in the model works), or the default of a single-column
      key.
    - ``payload(instance, event=, changed=)``: bytes, str or JSON-serialisable. Default: a small
      JSON document, see ``Registration.default_payload``.

    Registering a proxy registers its concrete model; saves through any proxy count. The call
    returns ``model``; without ``model`` it returns a class decorator. Raises
    ``QueueConfigurationError`` for unknown events or fields and for queues the default key
    cannot fill.
    """
    if model is None:

        def decorator(cls: M) -> M:
            return register(cls, queue=queue, on=on, fields=fields, key=key, payload=payload)

        return decorator

    concrete: type[Model] = model._meta.concrete_model or model
    events = frozenset([on] if isinstance(on, str) else on)
    if not events or events - set(EVENTS):
        raise QueueConfigurationError(
            f"outbox.register({concrete._meta.label}): on={sorted(events)!r}; "
            f"events are {', '.join(EVENTS)}."
        )
    if key is not None and not callable(key):
        raise QueueConfigurationError("outbox.register: key must be a callable.")
    if payload is not None and not callable(payload):
        raise QueueConfigurationError("outbox.register: payload must be a callable.")
    registration = Registration(
        concrete,
        queue=queue,
        on=events,
        fields=None if fields is None else resolve_fields(concrete, fields),
        key=key,
        payload=payload,
    )
    if apps.ready or not isinstance(queue, str):
        registration.queue_model()  # resolve and check now; later on first use otherwise
    existing = registered.get(concrete, [])
    if any(r.queue_label.lower() == registration.queue_label.lower() for r in existing):
        raise QueueConfigurationError(
            f"{concrete._meta.label} is already registered with the outbox for queue "
            f"{registration.queue_label}; unregister it first or use another queue."
        )
    registered[concrete] = [*existing, registration]
    connect(concrete)
    return model


def unregister(model: type[Model], queue: str | type[Queue] | None = None) -> None:
    """Forget the registrations of ``model`` (only the one for ``queue`` if given)."""
    concrete: type[Model] = model._meta.concrete_model or model
    if queue is None:
        registered.pop(concrete, None)
    else:
        label = queue if isinstance(queue, str) else queue._meta.label
        kept = [r for r in registered.get(concrete, []) if r.queue_label.lower() != label.lower()]
        if kept:
            registered[concrete] = kept
        else:
            registered.pop(concrete, None)
    connect(concrete)

"""Outbox registration: ``register``/``unregister``, the ``Registration`` each call makes (which
events of a model send to which queue, and how its message is built), the store of them by
concrete model, and the model-signal receivers connected to match the store: ``pre_save`` plans
and validates, ``post_save`` sends in the save's transaction, ``pre_delete`` sends before the
row's DELETE. One module because every part reads or changes the one store."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

from django.apps import apps
from django.core.exceptions import FieldDoesNotExist
from django.db import connections, router, transaction
from django.db.models import CharField, Field, Model, TextField
from django.db.models.signals import class_prepared, post_save, pre_delete, pre_save
from django.utils.encoding import is_protected_type

from spanner_queues.api import build_message, send_outgoing
from spanner_queues.engines import engine_for
from spanner_queues.envelope import envelope_of
from spanner_queues.exceptions import (
    InvalidMessage,
    PayloadError,
    QueueConfigurationError,
    QueueError,
    TransactionRequired,
)
from spanner_queues.keys import key_fields
from spanner_queues.options import queue_options
from spanner_queues.outbox.changes import classify, possible_events, restrict
from spanner_queues.queues import get_queue
from spanner_queues.uniqueness import checked_window

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
    unique_for: timedelta | None = None,
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
    unique_for: timedelta | None = None,
) -> Callable[[M], M]: ...


def register(
    model: M | None = None,
    *,
    queue: str | type[Queue],
    on: str | Iterable[str] = EVENTS,
    fields: Iterable[str] | None = None,
    key: KeyBuilder | None = None,
    payload: PayloadBuilder | None = None,
    unique_for: timedelta | None = None,
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
    - ``unique_for``: a positive ``timedelta``: send each key at most once per window
      (``api.send_many``); a save whose key was sent less than that long ago sends nothing.
      Give a ``key`` that names what should be sent once (the default key is new each time).

    Registering a proxy registers its concrete model; saves through any proxy count. The call
    returns ``model``; without ``model`` it returns a class decorator. Raises
    ``QueueConfigurationError`` for unknown events or fields and for queues the default key
    cannot fill.
    """
    if model is None:

        def decorator(cls: M) -> M:
            return register(
                cls,
                queue=queue,
                on=on,
                fields=fields,
                key=key,
                payload=payload,
                unique_for=unique_for,
            )

        return decorator

    concrete: type[Model] = model._meta.concrete_model or model
    registration = Registration(
        concrete,
        queue=queue,
        on=_checked_events(concrete, on, key, payload),
        fields=None if fields is None else _resolve_fields(concrete, fields),
        key=key,
        payload=payload,
        unique_for=None if unique_for is None else checked_window(unique_for),
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


def _checked_events(
    concrete: type[Model],
    on: str | Iterable[str],
    key: KeyBuilder | None,
    payload: PayloadBuilder | None,
) -> frozenset[str]:
    """``register``'s events, checked with its builders."""
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
    return events


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


def registrations(model: type[Model] | None = None) -> list[Registration]:
    """The registrations of ``model`` (its concrete model), or all of them."""
    if model is None:
        return [r for regs in registered.values() for r in regs]
    return list(registered.get(model._meta.concrete_model or model, []))


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
        unique_for: timedelta | None = None,
    ) -> None:
        self.model = model
        self.unique_for = unique_for
        self.queue = queue
        self.on = on
        self.explicit_fields = fields is not None
        self.fields: tuple[Field, ...] = fields if fields is not None else _trackable(model)
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
            self._default_key = None if self.key else _default_key_builder(self, model)
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

    def build_outgoing(
        self, instance: Model, event: str, changed: frozenset[str]
    ) -> OutgoingMessage:
        """The message for one event, validated and with its payload encoded, which
        ``send_specs`` writes without validating it again. Raises ``PayloadError`` or
        ``InvalidMessage`` naming the registration; nothing is written here."""
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
            spec = {**key, "payload": payload}
            if envelope_of(queue._meta.label) is not None:
                spec["event"] = {"type": event_type(self.model, event), "subject": instance.pk}
            return build_message(queue, spec)
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
            "pk": _jsonable(instance.pk),
            "event": event,
        }
        if event == "updated":
            document["changed"] = sorted(changed)
        if event == "deleted" and self.explicit_fields:
            document["data"] = {f.name: _field_value(f, instance) for f in self.fields}
        return document  # encoded like every payload: the engine's JSON_ENCODER


# --- the default key and payload ---------------------------------------------------------


def event_type(model: type[Model], event: str) -> str:
    """The CloudEvents ``type`` of an outbox message on an envelope queue:
    ``<app_label>.<model_name>.<created|updated|deleted>`` (``shop.order.created``)."""
    return f"{model._meta.app_label}.{model._meta.model_name}.{event}"


def _trackable(model: type[Model]) -> tuple[Field, ...]:
    return tuple(f for f in model._meta.concrete_fields if not f.primary_key)


def _resolve_fields(model: type[Model], names: Iterable[str]) -> tuple[Field, ...]:
    if isinstance(names, str):
        names = [names]
    resolved: list[Field] = []
    by_attname = {f.attname: f for f in model._meta.concrete_fields}
    for name in names:
        try:
            field: object = model._meta.get_field(name)
        except FieldDoesNotExist:
            field = by_attname.get(name)
        # (relations and generic foreign keys are not Fields; none of them is concrete)
        if not isinstance(field, Field) or not field.concrete or field.many_to_many:
            known = ", ".join(f.name for f in _trackable(model))
            raise QueueConfigurationError(
                f"outbox.register({model._meta.label}): {name!r} is not a concrete field; "
                f"fields are {known}."
            )
        if field not in resolved:
            resolved.append(field)
    return tuple(resolved)


def _default_key_builder(
    registration: Registration, queue: type[Queue]
) -> Callable[[Model], dict[str, Any]]:
    """Key = the model's primary key in the queue's leading key fields + a fresh message id."""
    model = registration.model
    queue_key = key_fields(queue)
    model_key = key_fields(model)
    label = f"outbox.register({model._meta.label}, queue={queue._meta.label!r})"
    if "deleted" in registration.on:
        parent = queue_options(queue).interleave_in_parent
        for field in queue_key:
            if field.is_relation and field.related_model._meta.concrete_model is model:
                raise QueueConfigurationError(
                    f"{label}: the queue's key {field.name!r} references {model._meta.label}"
                    f"{' (interleaved)' if field.name == parent else ''}, so a 'deleted' "
                    "message would be deleted with its row (or refused by the database). "
                    "Send 'deleted' events to a queue that does not reference the model."
                )
    last = queue_key[-1]
    if not last.has_default() and not (
        isinstance(last, (CharField, TextField))
        and (last.max_length is None or last.max_length >= 32)
    ):
        raise QueueConfigurationError(
            f"{label}: the default key builder puts a uuid4 hex in {last.name!r}, which needs "
            "a default or a CharField of max_length >= 32. Pass key=."
        )

    def message_id() -> Any:
        return last.get_default() if last.has_default() else uuid.uuid4().hex

    if len(queue_key) == 1:
        return lambda instance: {last.attname: message_id()}
    if len(queue_key) != len(model_key) + 1:
        raise QueueConfigurationError(
            f"{label}: the default key builder needs {len(model_key) + 1} queue key field(s) "
            f"(the model's key, then a message id); the queue has {len(queue_key)}. Pass key=."
        )
    for field in queue_key[:-1]:
        if field.is_relation and field.related_model._meta.concrete_model is not model:
            raise QueueConfigurationError(
                f"{label}: the queue's key field {field.name!r} references "
                f"{field.related_model._meta.label}, not {model._meta.label}. Pass key=."
            )
    targets = [f.attname for f in queue_key[:-1]]
    sources = [f.attname for f in model_key]

    def build(instance: Model) -> dict[str, Any]:
        key = {t: getattr(instance, s) for t, s in zip(targets, sources, strict=True)}
        key[last.attname] = message_id()
        return key

    return build


def _field_value(field: Field, instance: Model) -> Any:
    """A field's value as Django's serializers write it (JSON-friendly)."""
    value = field.value_from_object(instance)
    if value is None or is_protected_type(value):
        return value
    if isinstance(value, (str, bool, list, dict)):
        return value
    return field.value_to_string(instance)


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


# --- the guard and the send, shared with ``manual`` ---------------------------------------


def send_specs(specs: list[tuple[Registration, OutgoingMessage]], using: str) -> None:
    """Write the messages ``build_outgoing`` made (validated then), one INSERT per queue."""
    if len(specs) == 1:
        registration, outgoing = specs[0]
        send_outgoing(
            registration.queue_model(), [outgoing], using=using, unique_for=registration.unique_for
        )
        return
    # one INSERT per queue and window (registrations of one queue may differ in unique_for)
    by_queue: dict[tuple[str, timedelta | None], tuple[type[Queue], list[OutgoingMessage]]] = {}
    for registration, outgoing in specs:
        queue = registration.queue_model()
        place = (queue._meta.label, registration.unique_for)
        by_queue.setdefault(place, (queue, []))[1].append(outgoing)
    for (_, window), (queue, batch) in by_queue.items():
        send_outgoing(queue, batch, using=using, unique_for=window)


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


# --- the model-signal receivers -----------------------------------------------------------


_STASH = "_spanner_queues_outbox"  # per-instance, between pre_save and post_save of one save
_connected: dict[type[Model], set[type[Model]]] = {}  # concrete model -> senders connected


class _Planned:
    """What ``pre_save`` decided for one save; consumed by the matching ``post_save``."""

    __slots__ = ("changed", "event", "specs")

    def __init__(
        self,
        event: str,
        changed: frozenset[str] | None,
        specs: list[tuple[Registration, OutgoingMessage]] | None,
    ) -> None:
        self.event = event
        self.changed = changed
        self.specs = specs  # None: not built yet (the primary key is assigned by the INSERT)


def _pre_save(
    sender: type[Model],
    instance: Model,
    raw: bool,
    using: str,
    update_fields: frozenset[str] | None,
    **kwargs: Any,
) -> None:
    regs = registered.get(sender._meta.concrete_model or sender)
    if not regs or raw:
        return
    possible = possible_events(instance, update_fields)
    firing = [
        r for r in regs if any(r.fires(e, restrict(None, update_fields, r)) for e in possible)
    ]
    stack = instance.__dict__.setdefault(_STASH, [])
    if not firing:
        # One entry per save, even when nothing can fire: post_save pops its own save's
        # entry, never one left behind by an earlier save that failed between the signals.
        stack.append(None)
        return
    for registration in firing:
        require_transaction(registration, using, f"{sender._meta.label}.save()")
    event, changed = classify(regs, instance, possible, using, update_fields)
    specs = None
    if instance.pk is not None:  # build and validate before the row is written
        specs = _build_all(regs, instance, event, changed, update_fields)
    stack.append(_Planned(event, changed, specs))


def _post_save(
    sender: type[Model],
    instance: Model,
    created: bool,
    raw: bool,
    using: str,
    update_fields: frozenset[str] | None,
    **kwargs: Any,
) -> None:
    stack = instance.__dict__.get(_STASH)
    if raw or not stack or not registered.get(sender._meta.concrete_model or sender):
        return
    planned: _Planned | None = stack.pop()  # this save's own entry (pushed last)
    if not stack:
        del instance.__dict__[_STASH]
    if planned is None:
        return
    try:
        event = "created" if created else "updated"
        specs = planned.specs
        if specs is None or event != planned.event:
            # The INSERT assigned the key, or the save turned out to be the other event (an
            # added instance whose explicit key existed, an UPDATE that found no row). A
            # failure from here on poisons the transaction, so the row cannot commit alone.
            changed = planned.changed if event == planned.event else None
            regs = registered.get(sender._meta.concrete_model or sender, [])
            specs = _build_all(regs, instance, event, changed, update_fields)
        send_specs(specs, using)
    except BaseException:
        poison(using)
        raise


def _build_all(
    regs: list[Registration],
    instance: Model,
    event: str,
    changed: frozenset[str] | None,
    update_fields: frozenset[str] | None,
) -> list[tuple[Registration, OutgoingMessage]]:
    specs = []
    for registration in regs:
        names = restrict(changed, update_fields, registration)
        if registration.fires(event, names):
            if event != "updated":
                names = frozenset()
            elif names is None:
                names = registration.field_names
            specs.append((registration, registration.build_outgoing(instance, event, names)))
    return specs


def _pre_delete(sender: type[Model], instance: Model, using: str, **kwargs: Any) -> None:
    regs = [
        r for r in registered.get(sender._meta.concrete_model or sender, []) if "deleted" in r.on
    ]
    if not regs:
        return
    for registration in regs:
        # Django's Collector runs pre_delete inside atomic(); this guards manual sends.
        require_transaction(registration, using, f"{sender._meta.label}.delete()")
    try:
        specs = [(r, r.build_outgoing(instance, "deleted", frozenset())) for r in regs]
        send_specs(specs, using)  # before the row's DELETE, in the Collector's transaction
    except BaseException:
        poison(using)
        raise


def connect(concrete: type[Model]) -> None:
    """(Re)connect the receivers for ``concrete`` and its proxies to match the store."""
    for sender in _connected.pop(concrete, set()):
        uid = _uid(sender)
        pre_save.disconnect(sender=sender, dispatch_uid=uid)
        post_save.disconnect(sender=sender, dispatch_uid=uid)
        pre_delete.disconnect(sender=sender, dispatch_uid=uid)
    regs = registered.get(concrete)
    if not regs:
        return
    senders = {concrete} | {
        m
        for models in apps.all_models.values()
        for m in models.values()
        if m._meta.proxy and m._meta.concrete_model is concrete
    }
    saves = any(r.on & {"created", "updated"} for r in regs)
    deletes = any("deleted" in r.on for r in regs)
    for sender in senders:
        uid = _uid(sender)
        if saves:
            pre_save.connect(_pre_save, sender=sender, weak=False, dispatch_uid=uid)
            post_save.connect(_post_save, sender=sender, weak=False, dispatch_uid=uid)
        if deletes:
            # Only registered models lose Django's fast delete (which sends no signals).
            pre_delete.connect(_pre_delete, sender=sender, weak=False, dispatch_uid=uid)
    _connected[concrete] = senders


def _uid(sender: type[Model]) -> str:
    return f"spanner_queues.outbox:{sender.__module__}.{sender.__qualname__}"


def _proxy_prepared(sender: type[Model], **kwargs: Any) -> None:
    """A proxy defined after its concrete model was registered is connected too."""
    if sender._meta.proxy and sender._meta.concrete_model in registered:
        connect(sender._meta.concrete_model)


class_prepared.connect(_proxy_prepared, weak=False, dispatch_uid="spanner_queues.outbox.proxy")

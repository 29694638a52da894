"""Outbox builders: the default message key and payload of a registration, and the field
helpers they use. Pure functions of a model, a queue and an instance; nothing is written."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import FieldDoesNotExist
from django.db.models import CharField, Field, Model, TextField
from django.utils.encoding import is_protected_type

from spanner_queues.exceptions import QueueConfigurationError
from spanner_queues.keys import key_fields
from spanner_queues.options import queue_options

if TYPE_CHECKING:
    from spanner_queues.models import Queue
    from spanner_queues.outbox.registration import Registration


def trackable(model: type[Model]) -> tuple[Field, ...]:
    return tuple(f for f in model._meta.concrete_fields if not f.primary_key)


def resolve_fields(model: type[Model], names: Iterable[str]) -> tuple[Field, ...]:
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
            known = ", ".join(f.name for f in trackable(model))
            raise QueueConfigurationError(
                f"outbox.register({model._meta.label}): {name!r} is not a concrete field; "
                f"fields are {known}."
            )
        if field not in resolved:
            resolved.append(field)
    return tuple(resolved)


def default_key_builder(
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


def field_value(field: Field, instance: Model) -> Any:
    """A field's value as Django's serializers write it (JSON-friendly)."""
    value = field.value_from_object(instance)
    if value is None or is_protected_type(value):
        return value
    if isinstance(value, (str, bool, list, dict)):
        return value
    return field.value_to_string(instance)


def jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [jsonable(v) for v in value]
    return value

"""Outbox signal plumbing: ``pre_save`` plans and validates, ``post_save`` sends in the save's
transaction, ``pre_delete`` sends before the row's DELETE; ``connect`` wires them to a
registered model and its proxies."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db.models import Model
from django.db.models.signals import class_prepared, post_save, pre_delete, pre_save

from spanner_queues.outbox.changes import classify, possible_events, restrict
from spanner_queues.outbox.registration import (
    Registration,
    poison,
    registered,
    require_transaction,
    send_specs,
)

if TYPE_CHECKING:
    from spanner_queues.message import OutgoingMessage

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
    """(Re)connect the receivers for ``concrete`` and its proxies to match the registry."""
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

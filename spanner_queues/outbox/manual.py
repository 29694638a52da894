"""The paths that send no model signals (``bulk_create``, ``QuerySet.update``, ``bulk_update``,
raw deletes): ``send_for`` sends their messages, and the opt-in ``OutboxQuerySet`` refuses them
outside ``manual_send()``."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, router
from django.db.models import QuerySet

from spanner_queues.api import send_outgoing
from spanner_queues.exceptions import InvalidArgument, OutboxBypassed, TransactionRequired
from spanner_queues.outbox.registration import EVENTS, registered, require_transaction

if TYPE_CHECKING:
    from django.db.models import Model

    from spanner_queues.message import Message, OutgoingMessage
    from spanner_queues.models import Queue


def send_for(
    objs: Iterable[Model],
    *,
    event: str,
    changed: Iterable[str] | None = None,
    using: str | None = None,
) -> list[Message]:
    """Send the outbox messages for ``objs`` as if each had been saved or deleted: for paths
    that send no model signals (``bulk_create``, ``QuerySet.update``, ``bulk_update``,
    ``_raw_delete``).

    Call it inside the ``atomic()`` block that makes the change (before a raw delete, while the
    rows exist). ``changed`` names the updated fields (default: every field counts). One
    ``send_many`` per queue; every message is built and validated before the first is written.
    Raises ``TransactionRequired`` outside ``atomic()``. A registration's ``unique_for`` applies
    (a dropped message comes back with ``dropped=True``).
    """
    if event not in EVENTS:
        raise InvalidArgument(f"event must be one of {', '.join(EVENTS)}, not {event!r}.")
    names = None if changed is None else frozenset(changed)
    batches: dict[tuple[str, str, timedelta | None], tuple[type[Queue], list[OutgoingMessage]]] = {}
    for instance in objs:
        concrete = instance._meta.concrete_model or type(instance)
        db = using or instance._state.db or router.db_for_write(concrete, instance=instance)
        connection = connections[db]
        if not connection.in_atomic_block and connection.get_autocommit():
            # Even when no registration fires: a call outside the change's transaction is
            # the caller's mistake whatever is registered today.
            raise TransactionRequired(
                f"outbox.send_for(..., event={event!r}) outside transaction.atomic("
                f"using={db!r}): call it inside the atomic() block that makes the change. "
                "Nothing was written."
            )
        for registration in registered.get(concrete, []):
            own = None if names is None else registration.names_of(names)
            if not registration.fires(event, own):
                continue
            require_transaction(registration, db, f"outbox.send_for(..., event={event!r})")
            if event != "updated":
                own = frozenset()
            spec = registration.build_outgoing(
                instance, event, registration.field_names if own is None else own
            )
            queue = registration.queue_model()
            place = (queue._meta.label, db, registration.unique_for)
            batches.setdefault(place, (queue, []))[1].append(spec)
    sent: list[Message] = []
    for (_, db, window), (queue, specs) in batches.items():
        sent.extend(send_outgoing(queue, specs, using=db, unique_for=window))
    return sent


_manual: contextvars.ContextVar[int] = contextvars.ContextVar("outbox_manual_send", default=0)


@contextlib.contextmanager
def manual_send() -> Iterator[None]:
    """Allow ``OutboxQuerySet``'s signal-free writes (``bulk_create``, ``update``,
    ``bulk_update``) in this thread for the block; the caller sends their messages itself with
    ``send_for`` in the same ``atomic()`` block."""
    token = _manual.set(_manual.get() + 1)
    try:
        yield
    finally:
        _manual.reset(token)


class OutboxQuerySet(QuerySet):
    """Opt-in (``objects = OutboxQuerySet.as_manager()``): refuses ``bulk_create``,
    ``update`` and ``bulk_update`` of a model registered with the outbox, which would change
    rows without their messages, unless the caller is inside ``outbox.manual_send()`` (and
    calls ``send_for``). ``delete()`` sends signals and is always allowed."""

    def _guard(self, what: str) -> None:
        concrete = self.model._meta.concrete_model or self.model
        if _manual.get() or not registered.get(concrete):
            return
        raise OutboxBypassed(
            f"{self.model._meta.label}.objects.{what}() sends no model signals, so the outbox "
            "would write no message for it. Wrap it in `with outbox.manual_send():` and call "
            "outbox.send_for(objs, event=...) in the same atomic() block, or save() each row."
        )

    def bulk_create(self, *args: Any, **kwargs: Any) -> Any:
        self._guard("bulk_create")
        return super().bulk_create(*args, **kwargs)

    def update(self, *args: Any, **kwargs: Any) -> int:
        self._guard("update")
        return super().update(*args, **kwargs)

    def bulk_update(self, *args: Any, **kwargs: Any) -> int:
        self._guard("bulk_update")
        return super().bulk_update(*args, **kwargs)

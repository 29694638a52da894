"""The verbs users call: send, replace, receive, renew, release, ack. Each resolves the queue's
engine and delegates across the seam; none knows how a queue is stored."""

from __future__ import annotations

import functools
import threading
import uuid
import warnings
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from dataclasses import replace as dataclass_replace
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Model
from django.utils import timezone

from spanner_queues import clock, instrumentation, uniqueness
from spanner_queues.controls import (
    MessageCancellation,
    is_paused,
    pause,
    prune_cancellations_if_due,
    resume,
)
from spanner_queues.engines import engine_for
from spanner_queues.envelope import envelope_of, wrap
from spanner_queues.exceptions import (
    InvalidArgument,
    InvalidMessage,
    LeaseLost,
    MessageAlreadyAcked,
    QueueConfigurationError,
)
from spanner_queues.failures import key_text
from spanner_queues.keys import key_fields, key_filter, key_names, row_to_message
from spanner_queues.message import LATEST_DELIVER_TIME, Message, OutgoingMessage
from spanner_queues.payload import encode_payload, payload_type
from spanner_queues.queues import get_queue, queue_models
from spanner_queues.receivers import held_lease_token, mark_acked
from spanner_queues.signals import (
    messages_acked,
    messages_cancelled,
    messages_sent,
    requeued,
    send_on_commit,
    sends_dropped,
)
from spanner_queues.storage import rows as rows_of
from spanner_queues.transactions import run_in_transaction
from spanner_queues.uniqueness import checked_window

if TYPE_CHECKING:
    from spanner_queues.engines.base import BaseQueueEngine
    from spanner_queues.models import Queue

__all__ = [
    "ack",
    "ack_many",
    "cancel",
    "is_paused",
    "pause",
    "receive",
    "release",
    "renew",
    "renew_many",
    "replace",
    "requeue",
    "requeue_many",
    "resume",
    "row_to_message",
    "send",
    "send_many",
]

_RESERVED = {"payload", "deliver_time", "delay"}
#: (database, queue) pairs already warned that their engine ignores ``receive(lease=...)``:
#: at most one entry per declared queue and engine
_lease_warned: set[tuple[str, str]] = set()
_lease_warned_lock = threading.Lock()


def _database(model: type[Queue], using: str | None) -> str:
    """A queue lives in its engine's database; ``using`` may only name that database (or an
    alias of the same connection settings, e.g. in tests)."""
    return using or engine_for(model).database


def _deliver_time(deliver_time: datetime | None, delay: timedelta | None) -> datetime | None:
    """The validated deliver time (UTC), or None for "now"; ``InvalidMessage`` saying why."""
    if deliver_time is not None and delay is not None:
        raise InvalidMessage("Pass deliver_time or delay, not both.")
    if delay is not None:
        if not isinstance(delay, timedelta):
            raise InvalidMessage(f"delay must be a timedelta, not {type(delay).__name__}.")
        try:
            deliver_time = clock.now() + delay
        except OverflowError:
            raise InvalidMessage(f"delay {delay} is out of range.") from None
    elif deliver_time is not None:
        if not isinstance(deliver_time, datetime) or timezone.is_naive(deliver_time):
            raise InvalidMessage("deliver_time must be a timezone-aware datetime.")
        try:
            deliver_time = deliver_time.astimezone(dt_timezone.utc)
        except OverflowError:
            raise InvalidMessage(f"deliver_time {deliver_time} is out of range.") from None
    if deliver_time is not None and deliver_time > LATEST_DELIVER_TIME:
        raise InvalidMessage(
            f"deliver_time {deliver_time} is after {LATEST_DELIVER_TIME:%Y-%m-%d}, the latest "
            "a queue accepts."
        )
    return deliver_time


def _type_error(target: Any, value: Any) -> str | None:
    """Why ``value`` is not of the key field's type (no silent coercion: ``["a"]`` is not the
    string ``"['a']"``, ``1.7`` is not the integer ``1``), or None."""
    if isinstance(target, (models.CharField, models.TextField)):
        return None if isinstance(value, str) else "expected a str"
    if isinstance(target, (models.IntegerField, models.AutoField)):
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else "expected an int"
    if isinstance(target, models.UUIDField):
        return None if isinstance(value, (uuid.UUID, str)) else "expected a UUID or str"
    if isinstance(target, models.BinaryField):
        return None if isinstance(value, (bytes, bytearray, memoryview)) else "expected bytes"
    return None


@dataclass(frozen=True, slots=True)
class _KeyField:
    """A key field as ``build_message`` checks it (per queue, computed once)."""

    field: Any
    target: Any  # what the value validates as: a ForeignKey's target field, else the field
    max_length: int | None


def _key_value(model: type[Queue], key: _KeyField, value: Any) -> Any:
    """Convert a key value as the field would, or raise ``InvalidMessage`` saying why: of the
    field's type (never coerced), within its validators (lengths, integer ranges), and text
    every database can store (no lone surrogate)."""
    field, target = key.field, key.target
    if value is None:
        raise InvalidMessage(f"{model._meta.label}: key field {field.name!r} cannot be None.")
    wrong = _type_error(target, value)
    if wrong:
        raise InvalidMessage(
            f"{model._meta.label}: bad value {value!r} for key field {field.name!r}: {wrong}, "
            f"not {type(value).__name__}."
        )
    try:
        value = target.to_python(value)
        target.run_validators(value)
    except ValidationError as exc:
        raise InvalidMessage(
            f"{model._meta.label}: bad value {value!r} for key field {field.name!r}: "
            f"{'; '.join(exc.messages)}"
        ) from exc
    if isinstance(value, str):
        max_length = key.max_length
        if max_length is not None and len(value) > max_length:
            raise InvalidMessage(
                f"{model._meta.label}: key field {field.name!r} is longer than {max_length} "
                "characters."
            )
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:  # a lone surrogate: no database stores it
                raise InvalidMessage(
                    f"{model._meta.label}: key field {field.name!r} is not valid Unicode text "
                    f"(a lone surrogate {value[exc.start]!r} at position {exc.start})."
                ) from exc
    return value


@functools.cache
def _send_plan(model: type[Queue]) -> tuple[dict[str, _KeyField], tuple[Any, ...], str]:
    """Per queue (declarations do not change): key fields by name and attname, the key fields
    in key order, the payload type."""
    key = key_fields(model)
    checked = {}
    for f in key:
        target = getattr(f, "target_field", f)  # a ForeignKey validates as its target
        checked[f] = _KeyField(f, target, getattr(target, "max_length", None))
    by_name = {f.name: checked[f] for f in key} | {f.attname: checked[f] for f in key}
    return by_name, key, payload_type(model)


def build_message(
    model: type[Queue],
    spec: Mapping[str, Any],
    *,
    engine: BaseQueueEngine | None = None,
    carrier: Mapping[str, str] | None = None,
) -> OutgoingMessage:
    """Validate one message before anything is written: key fields, payload, deliver time.
    ``engine``: the queue's engine, when the caller has it already. On an envelope queue the
    payload is wrapped in its event (``spanner_queues.envelope``), with the trace context
    ``carrier`` (None: the installed instrumentation's of the caller now)."""
    if engine is None:
        engine = engine_for(model)
    if type(spec) is not dict and not isinstance(spec, Mapping):
        raise InvalidMessage(
            f"{model._meta.label}: a message is a mapping of key fields and payload, not "
            f"{type(spec).__name__} {spec!r}."
        )
    label = model._meta.label
    envelope = envelope_of(label)
    key, kind = _key_of(model, spec, envelope=envelope is not None)
    params = engine.params
    deliver_time = spec.get("deliver_time")
    delay = spec.get("delay")
    if envelope is None:
        payload = encode_payload(
            spec.get("payload", b""),
            payload_type=kind,
            max_bytes=params.max_payload_bytes,
            encoder=params.json_encoder,
        )
    else:
        if carrier is None and instrumentation.installed is not None:
            carrier = instrumentation.installed.carrier()
        payload = wrap(
            spec.get("payload", b""),
            label=label,
            payload_type=kind,
            event=spec.get("event"),
            carrier=carrier,
            now=clock.now(),
            max_bytes=params.max_payload_bytes,
            encoder=params.json_encoder,
        )
    if deliver_time is not None or delay is not None:
        deliver_time = _deliver_time(deliver_time, delay)
    # OutgoingMessage(key=..., payload=..., deliver_time=..., send_time=None) without its
    # keyword call
    outgoing = _new(OutgoingMessage)
    _set(outgoing, "key", key)
    _set(outgoing, "payload", payload)
    _set(outgoing, "deliver_time", deliver_time)
    _set(outgoing, "send_time", None)
    return outgoing


def _key_of(
    model: type[Queue], spec: Mapping[str, Any], *, envelope: bool
) -> tuple[dict[str, Any], str]:
    """The key of a message (every key field, checked, by attribute name; a missing one
    takes its default) and the queue's payload type. ``event`` is a key field's name only
    off envelope queues."""
    fields, ordered, kind = _send_plan(model)
    key: dict[str, Any] = {}
    label = model._meta.label
    for name, value in spec.items():
        if name in _RESERVED or (name == "event" and envelope):
            continue
        checked = fields.get(name)
        if checked is None:
            if name == "event":  # (a key field may be named so: reserved on envelope queues only)
                raise InvalidMessage(
                    f"{label}: event= is for envelope queues (QueueMeta.envelope = 'cloudevents')."
                )
            raise InvalidMessage(
                f"{label}: {name!r} is not a key field; key fields are "
                f"{', '.join(f.name for f in ordered)}."
            )
        if isinstance(value, Model):  # a related object given for a ForeignKey key field
            value = value.pk
        key[checked.field.attname] = _key_value(model, checked, value)
    if len(key) != len(ordered):
        for field in ordered:
            if field.attname not in key:
                if not field.has_default():
                    raise InvalidMessage(f"{label}: key field {field.name!r} is missing.")
                key[field.attname] = _key_value(model, fields[field.name], field.get_default())
    return key, kind


_new = object.__new__
_set = object.__setattr__  # what a frozen dataclass's own __init__ calls per field
assert tuple(f.name for f in dataclass_fields(OutgoingMessage)) == (
    "key", "payload", "deliver_time", "send_time"
), "OutgoingMessage changed: update build_message"  # fmt: skip


def send_many(
    queue: str | type[Queue],
    messages: Iterable[Mapping[str, Any]],
    *,
    using: str | None = None,
    unique_for: timedelta | None = None,
) -> list[Message]:
    """Send messages in the caller's transaction (one INSERT, or one per 950 query
    parameters where the database limits them). Every message is validated first, so a bad
    one writes nothing.

    ``unique_for`` (a positive ``timedelta``): send each key at most once per window. A key
    sent with ``unique_for`` less than that long ago (handled and acked since or not), or
    earlier in ``messages``, is dropped: nothing is written for it, its ``Message`` has
    ``dropped=True`` and an INFO line on the ``spanner_queues.uniqueness`` logger names it.
    The ledger (``uniqueness.SentKey``) is written in the same transaction as the messages
    (a transaction of its own outside one); see ``spanner_queues.uniqueness``."""
    window = None if unique_for is None else checked_window(unique_for)
    model = get_queue(queue)
    engine = engine_for(model)
    tracing = instrumentation.installed
    if tracing is None:
        outgoing = [build_message(model, spec, engine=engine) for spec in messages]
        return send_outgoing(model, outgoing, using=using, engine=engine, unique_for=window)
    specs = list(messages)
    with tracing.sending(model._meta.label, len(specs)) as scope:
        carrier = scope.carrier
        outgoing = [build_message(model, s, engine=engine, carrier=carrier) for s in specs]
        sent = _write(model, outgoing, using=using, engine=engine, unique_for=window)
        scope.sent(sent)
        return sent


def send_outgoing(
    model: type[Queue],
    outgoing: Sequence[OutgoingMessage],
    *,
    using: str | None = None,
    engine: BaseQueueEngine | None = None,
    unique_for: timedelta | None = None,
) -> list[Message]:
    """Write messages already validated by ``build_message`` in the caller's transaction (one
    INSERT); ``send_many`` without validating them again (the outbox builds its messages
    before the row is written and sends them after). ``unique_for``: as ``send_many``'s."""
    if unique_for is not None:
        unique_for = checked_window(unique_for)
    tracing = instrumentation.installed
    if tracing is None or not outgoing:
        return _write(model, outgoing, using=using, engine=engine, unique_for=unique_for)
    with tracing.sending(model._meta.label, len(outgoing)) as scope:
        sent = _write(model, outgoing, using=using, engine=engine, unique_for=unique_for)
        scope.sent(sent)
        return sent


def _write(
    model: type[Queue],
    outgoing: Sequence[OutgoingMessage],
    *,
    using: str | None,
    engine: BaseQueueEngine | None,
    unique_for: timedelta | None = None,
) -> list[Message]:
    if not outgoing:
        return []
    if engine is None:
        engine = engine_for(model)
    db = using or engine.database
    if unique_for is not None:
        return _write_unique(model, outgoing, db=db, engine=engine, window=unique_for)
    sent = engine.send_many(model, outgoing, using=db)
    send_on_commit(messages_sent, model, sent, db)
    return sent


def _write_unique(
    model: type[Queue],
    outgoing: Sequence[OutgoingMessage],
    *,
    db: str,
    engine: BaseQueueEngine,
    window: timedelta,
) -> list[Message]:
    """Claim the keys in the ledger and send those claimed, in one transaction (the caller's
    when there is one); the others come back with ``dropped=True``."""
    label, names = model._meta.label, key_names(model)

    def run() -> list[Message]:
        keys = [tuple(m.key[n] for n in names) for m in outgoing]
        claimed = uniqueness.claim(label, [uniqueness.key_text(k) for k in keys], window, using=db)
        kept = [m for m, ok in zip(outgoing, claimed, strict=True) if ok]
        sent = iter(engine.send_many(model, kept, using=db) if kept else [])
        out = [
            next(sent)
            if ok
            else Message(
                queue=label,
                key=key,
                key_names=names,
                payload=m.payload,
                deliver_time=m.deliver_time,
                dropped=True,
            )
            for m, key, ok in zip(outgoing, keys, claimed, strict=True)
        ]
        send_on_commit(messages_sent, model, [m for m in out if not m.dropped], db)
        send_on_commit(sends_dropped, model, [m for m in out if m.dropped], db)
        return out

    sent = run_in_transaction(run, using=db, retries=engine.params.transaction_retries)
    uniqueness.prune_if_due(db)  # (outside a caller's transaction only)
    return sent


def send(
    queue: str | type[Queue],
    *,
    using: str | None = None,
    unique_for: timedelta | None = None,
    **spec: Any,
) -> Message:
    """Send one message; see ``Queue.send`` (``unique_for``: see ``send_many``)."""
    return send_many(queue, [spec], using=using, unique_for=unique_for)[0]


def replace(
    queue: str | type[Queue],
    key: Mapping[str, Any],
    *,
    payload: Any = b"",
    deliver_time: datetime | None = None,
    delay: timedelta | None = None,
    using: str | None = None,
) -> Message:
    """Delete any message under ``key`` (held or not, present or not) and send a new one in
    one transaction (``requeue`` of whatever is there)."""
    model = get_queue(queue)
    spec = dict(key, payload=payload, deliver_time=deliver_time, delay=delay)
    outgoing = build_message(model, spec)
    names = key_names(model)
    there = Message(
        queue=model._meta.label,
        key=tuple(outgoing.key[n] for n in names),
        key_names=names,
        payload=b"",
        deliver_time=None,
    )
    return _requeue(model, [there], [outgoing], to=None, using=using, missing_ok=True)[0]


_SAME: Any = object()


def requeue(
    message: Message,
    *,
    deliver_time: datetime | None = None,
    delay: timedelta | None = None,
    payload: Any = _SAME,
    to: str | type[Queue] | None = None,
    using: str | None = None,
) -> Message:
    """Ack ``message`` and send it again under the same key, due at ``deliver_time`` (or
    ``delay`` from now, or now), with ``payload`` (default: the same), to queue ``to``
    (default: the same; another queue must have the same key fields: dead-lettering, replay).

    Guarantees: the ack and the send are one transaction (the caller's when there is one):
    both or neither. The ack holds ``message``'s lease (inside a receiver run by the worker:
    the worker's current, renewed token; a listed message: by key), so where the engine checks
    leases (``supports_lease_checked_ack``) a message delivered again or replaced meanwhile
    raises ``StaleAck``, and a message already gone ``MessageAlreadyAcked``; nothing is sent
    and the caller's transaction is marked for rollback. The new message starts afresh: no
    attempt counted, no failure remembered. Inside a receiver the worker does not ack
    ``message`` again."""
    return _requeue_held([message], payload, deliver_time, delay, to, using)[0]


def requeue_many(
    messages: Sequence[Message],
    *,
    deliver_time: datetime | None = None,
    delay: timedelta | None = None,
    to: str | type[Queue] | None = None,
    using: str | None = None,
) -> list[Message]:
    """``requeue`` for messages of one queue, each with its own payload, in one transaction."""
    return _requeue_held(messages, _SAME, deliver_time, delay, to, using)


def _requeue_held(
    messages: Sequence[Message],
    payload: Any,
    deliver_time: datetime | None,
    delay: timedelta | None,
    to: str | type[Queue] | None,
    using: str | None,
) -> list[Message]:
    if not messages:
        return []
    model = get_queue(messages[0].queue)
    target = get_queue(to) if to is not None else model
    if target is not model:
        if key_names(target) != key_names(model):
            raise QueueConfigurationError(
                f"{target._meta.label} cannot hold messages of {model._meta.label}: key fields "
                f"{key_names(target)} differ from {key_names(model)}."
            )
        if engine_for(target).alias != engine_for(model).alias:
            raise QueueConfigurationError(
                f"{target._meta.label} and {model._meta.label} are served by different queue "
                "engines; a message moves between them only in one transaction of one engine."
            )
    outgoing = [
        build_message(
            target,
            dict(
                m.key_dict,
                payload=m.payload if payload is _SAME else payload,
                deliver_time=deliver_time,
                delay=delay,
            ),
        )
        for m in messages
    ]
    held = [
        dataclass_replace(m, payload=m.stored_payload, lease_token=held_lease_token(m))
        for m in messages
    ]
    sent = _requeue(model, held, outgoing, to=target, using=using)
    mark_acked(messages, _database(model, using))
    return sent


def _requeue(
    model: type[Queue],
    messages: Sequence[Message],
    outgoing: Sequence[OutgoingMessage],
    *,
    to: type[Queue] | None,
    using: str | None,
    missing_ok: bool = False,
) -> list[Message]:
    engine, db = engine_for(model), _database(model, using)

    def run() -> list[Message]:
        return requeued(engine, model, messages, outgoing, using=db, to=to, missing_ok=missing_ok)

    return run_in_transaction(run, using=db, retries=engine.params.transaction_retries)


def receive(
    queue: str | type[Queue],
    *,
    max_messages: int = 1,
    lease: timedelta | None = None,
    wait: float | None = None,
) -> list[Message]:
    """Lease up to ``max_messages`` due messages (a short transaction of its own).
    ``wait``: at most how many seconds to wait for the first on native queues, whose
    ``RECEIVE`` stream hands them over (default ``RECEIVE_WAIT_SECONDS``; 0: only what the
    stream holds now); the table engine answers from a query and never waits."""
    if not isinstance(max_messages, int) or isinstance(max_messages, bool) or max_messages < 1:
        raise InvalidArgument(f"max_messages must be an int of at least 1, not {max_messages!r}.")
    if lease is not None and (not isinstance(lease, timedelta) or lease <= timedelta(0)):
        raise InvalidArgument(f"lease must be a positive timedelta, not {lease!r}.")
    if wait is not None and (
        not isinstance(wait, (int, float)) or isinstance(wait, bool) or not wait >= 0
    ):
        raise InvalidArgument(f"wait must be a number of seconds >= 0, not {wait!r}.")
    model = get_queue(queue)
    engine = engine_for(model)
    if lease is not None and not engine.features.supports_custom_lease:
        _warn_lease_ignored(model, engine.alias)
    uniqueness.prune_if_due(engine.database)  # (a claim here marked it, at most hourly)
    return engine.receive(model, max_messages=max_messages, lease=lease, wait=wait)


def _warn_lease_ignored(model: type[Queue], alias: str) -> None:
    """A ``RuntimeWarning``, once per queue and engine in a process: ``lease=`` is ignored."""
    key = (alias, model._meta.label)
    with _lease_warned_lock:
        if key in _lease_warned:
            return
        _lease_warned.add(key)
    warnings.warn(
        f"{model._meta.label}: lease= is ignored by the engine {alias!r} "
        "(supports_custom_lease=False: Spanner leases every message for 10 s and renews it by "
        "10 s). The worker renews leases while receivers run; drop lease= (runqueueworker "
        "--lease) for this queue. Warned once per queue.",
        RuntimeWarning,
        stacklevel=3,
    )


def stop_receiving(queue: str | type[Queue] | None = None, *, wait: float | None = 5.0) -> None:
    """Stop this process's background receiving of ``queue`` (of every queue when None).
    Engines that stream (native: one ``RECEIVE_<Q>`` per queue and process, shared by its
    threads) end the stream; messages leased but not yet handed out come back after their
    lease. A later ``receive`` starts again. Waits up to ``wait`` seconds per stream."""
    models = [get_queue(queue)] if queue is not None else queue_models()
    for model in models:
        engine_for(model).stop_receiving(model, wait=wait)


def settle_receiving(
    queue: str | type[Queue],
    *,
    wait: float | None = None,
    ignore: Collection[tuple[Any, ...]] = (),
) -> bool:
    """Before stopping because nothing is due (``runqueueworker --burst``): True once no
    message of ``queue`` is leased to this process and not yet handed out, and the last look
    at the queue found nothing due but messages keyed in ``ignore`` (already handled by the
    caller: given back because no receiver of its release matches them); False while some
    may be leased and unread, or a look is still to come (receive, process and ask again).
    Engines that stream (native: a ``receive(wait=0)`` hands out what the stream holds
    without looking) look in a ``RECEIVE_<Q>`` call of their own that runs to its
    ``max_duration`` and let an open call end instead of cancelling it, at most ``wait``
    seconds (default: the engine's choice), and keep later calls short; others look in
    every ``receive`` and answer True at once."""
    model = get_queue(queue)
    return engine_for(model).settle_receiving(model, wait=wait, ignore=ignore)


def _key(model: type[Queue], message: Message | Mapping[str, Any] | tuple[Any, ...]) -> tuple:
    if isinstance(message, Message):
        return message.key
    if isinstance(message, Mapping):
        return tuple(
            message[f.attname] if f.attname in message else message[f.name]
            for f in key_fields(model)
        )
    return tuple(message)


def ack_many(
    queue: str | type[Queue],
    messages: Sequence[Message | Mapping[str, Any] | tuple[Any, ...]],
    *,
    using: str | None = None,
) -> None:
    """Delete messages by key in the caller's transaction, all or none. If any is gone, raise
    ``MessageAlreadyAcked``; the caller's transaction is then marked for rollback.

    Inside a receiver run by the worker, a message it was handed and acks here is not acked
    again by the worker. A received ``Message`` carries its lease: on engines with
    ``features.supports_lease_checked_ack`` (the table engine) it is acked only while its row
    still holds that lease token (inside a receiver run by the worker: the worker's current,
    renewed token), so a stale ack raises ``StaleAck`` (a ``LeaseLost``) instead of deleting a
    newer message sent under the same key. Keys given as mappings or tuples, and messages
    without a lease (listed ones), are acked by key alone, as native Spanner acks every one."""
    model = get_queue(queue)
    keys = [_key(model, m) for m in messages]
    if not keys:
        return
    engine, db = engine_for(model), _database(model, using)
    tokens = [held_lease_token(m) if isinstance(m, Message) else None for m in messages]
    engine.ack_many(model, keys, using=db, lease_tokens=tokens)
    # a worker's running receiver acked its own messages: not again
    mark_acked([m for m in messages if isinstance(m, Message)], db)
    send_on_commit(messages_acked, model, messages, db)


def ack(message: Message, *, using: str | None = None) -> None:
    """Acknowledge (delete) a message in the caller's transaction; exactly one row, or
    ``MessageAlreadyAcked`` / ``StaleAck`` (see ``ack_many``) and the transaction is marked for
    rollback."""
    ack_many(message.queue, [message], using=using)


def renew_many(messages: Sequence[Message]) -> list[Message]:
    """Extend the leases of messages of one queue; lost leases are left out of the result."""
    if not messages:
        return []
    model = get_queue(messages[0].queue)
    return engine_for(model).renew_leases(model, messages)


def renew(message: Message) -> Message:
    """Extend one lease; the token rotates. ``LeaseLost`` if it expired or is unknown."""
    renewed = renew_many([message])
    if not renewed:
        raise LeaseLost(f"{message}: lease lost (expired, acked, or delivered to another).")
    return renewed[0]


def release(message: Message, *, deliver_time: datetime | None = None) -> None:
    """Give a leased message back before its lease ends, due at ``deliver_time`` (or now)."""
    model = get_queue(message.queue)
    engine_for(model).release(model, message, deliver_time=_deliver_time(deliver_time, None))


def cancel(
    queue: str | type[Queue],
    message: Message | Mapping[str, Any] | tuple[Any, ...],
    *,
    reason: str,
    by: str = "",
    using: str | None = None,
) -> MessageCancellation:
    """Cancel a message, with a record of who (``by``) and why (``reason``): one transaction
    (the caller's, inside one). A pending message is deleted (``running`` False on the
    returned ``MessageCancellation``); a message a worker holds (leased) is not: its receiver
    is asked to stop (``running`` True), and sees it through ``MessageContext.cancelled``
    within ``controls.CANCEL_CHECK_SECONDS`` (its time limit stays the hard stop). Where the
    engine keeps no lease (native Spanner queues) the message is deleted and a receiver
    running it is asked to stop too. ``MessageAlreadyAcked`` if no message has the key."""
    model = get_queue(queue)
    key = _key(model, message)
    db = _database(model, using)

    def run() -> MessageCancellation:
        row = rows_of(model, db).filter(key_filter(model, key)).first()
        if row is None:
            raise MessageAlreadyAcked(f"{model._meta.label} {key!r}: no such message to cancel.")
        current = row_to_message(model, row)
        now = clock.now()
        leased = current.lease_expires_at is not None and current.lease_expires_at > now
        if not leased:
            ack_many(model, [key], using=db)
        record = MessageCancellation.objects.using(db).create(
            queue=model._meta.label,
            message_key=key_text(key),
            reason=str(reason)[:1000],
            by=str(by)[:200],
            cancelled_at=now,
            running=leased,
        )
        # inside the transaction: a receiver's writes (the Tasks app's result) commit with it
        messages_cancelled.send(sender=model, messages=[current], using=db, cancellation=record)
        return record

    record = run_in_transaction(run, using=db)
    prune_cancellations_if_due(db)  # (records past CANCELLATION_KEEP_DAYS; not in a caller's)
    return record

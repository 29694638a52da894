"""Messages on the wire: key values as the client writes and reads them, and the writes of the
native engine: ``INSERT`` and ``DELETE ... ASSERT_ROWS_MODIFIED 1`` DML through the caller's
Django connection and transaction, ``Send``/``Ack`` mutations in a batch commit of their own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from spanner_queues import clock
from spanner_queues.drivers import driver_for
from spanner_queues.exceptions import InvalidMessage, MessageAlreadyAcked, MessageAlreadyExists
from spanner_queues.keys import key_fields, key_names
from spanner_queues.message import Message, OutgoingMessage
from spanner_queues.native import client

if TYPE_CHECKING:
    from spanner_queues.engines.native import NativeQueueEngine
    from spanner_queues.models import Queue


def prep_key(model: type[Queue], key: Sequence[Any], connection: Any) -> list[Any]:
    """Key values as the ORM writes and filters them (``UUIDField`` -> 32-char hex,
    ``BinaryField`` -> base64 for the client): the same values for DML and mutations."""
    return [
        f.get_db_prep_value(v, connection, prepared=False)
        for f, v in zip(key_fields(model), key, strict=True)
    ]


def key_from_row(model: type[Queue], values: Sequence[Any]) -> tuple[Any, ...]:
    """RECEIVE key columns back to Python values, as the ORM reads them."""
    out = []
    for f, v in zip(key_fields(model), values, strict=True):
        if v is not None and f.get_internal_type() == "BinaryField":
            v = client.decode_bytes(v)
        elif v is not None:
            v = f.to_python(v)
        out.append(v)
    return tuple(out)


def insert(
    engine: NativeQueueEngine,
    model: type[Queue],
    messages: Sequence[OutgoingMessage],
    *,
    using: str,
) -> list[Message]:
    """``INSERT`` the messages in one transaction (the caller's, when there is one)."""
    decl = engine.declaration(model)
    names = key_names(model)
    now = clock.now()
    # A deliver time that is missing or already past means "now": DeliverTime is omitted
    # and Spanner delivers at once (it replaces past times "with a value closer to now").
    later = [m for m in messages if m.deliver_time is not None and m.deliver_time > now]
    at_once = [m for m in messages if m not in later]
    statements = []
    conn = connections[using]
    for group, timed in ((at_once, False), (later, True)):
        if not group:
            continue
        params: list[Any] = []
        for m in group:
            params.extend(prep_key(model, [m.key[n] for n in names], conn))
            params.append(client.wire_payload(decl.payload_type, m.payload))
            if timed:
                params.append(m.deliver_time)
        statements.append(
            (engine.cursor_dialect.insert(decl, len(group), with_deliver_time=timed), params)
        )
    try:
        # One transaction for all statements (immediate and delayed messages are two
        # INSERTs): all or nothing even outside the caller's ``atomic``.
        with transaction.atomic(using=using), conn.cursor() as cursor:
            for sql, params in statements:
                cursor.execute(sql, params)
    except Exception as exc:
        keys = ", ".join(str(tuple(m.key.values())) for m in messages)
        if client.grpc_status(exc) == "ALREADY_EXISTS":
            raise MessageAlreadyExists(
                f"{model._meta.label}: a message with key {keys} already exists "
                "(keys are identity; ack it first or use replace())."
            ) from exc
        if driver_for(using).is_missing_parent(exc):
            raise InvalidMessage(
                f"{model._meta.label}: no parent row for key {keys} (the queue is "
                "interleaved in its parent; create the parent first)."
            ) from exc
        raise
    return [
        Message(
            queue=model._meta.label,
            key=tuple(m.key[n] for n in names),
            key_names=names,
            payload=m.payload,
            deliver_time=m.deliver_time if m in later else now,
            send_time=now,
        )
        for m in messages
    ]


def delete(
    engine: NativeQueueEngine, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str
) -> None:
    """Ack: one ``DELETE ... ASSERT_ROWS_MODIFIED 1`` per key, all in one transaction (the
    caller's, when there is one). A missing message marks it for rollback and raises
    ``MessageAlreadyAcked``."""
    sql = engine.cursor_dialect.ack(engine.declaration(model))
    conn = connections[using]
    with transaction.atomic(using=using), conn.cursor() as cursor:
        for key in keys:
            try:
                cursor.execute(sql, prep_key(model, key, conn))
            except Exception as exc:
                if client.grpc_status(exc) != "OUT_OF_RANGE":
                    raise
                # Statement-level on Spanner: the transaction would still commit the
                # caller's other writes. Never continue it: mark it for rollback.
                transaction.set_rollback(True, using=using)
                raise MessageAlreadyAcked(
                    f"{model._meta.label}{tuple(key)!r}: no such message; it was already "
                    "acked (or deleted). Roll back: the work may have been done by "
                    "another receiver."
                ) from exc


def send_mutations(
    engine: NativeQueueEngine, model: type[Queue], messages: Sequence[OutgoingMessage]
) -> Any:
    """``Send`` mutations in one batch commit, outside any Django transaction; the commit
    timestamp. ``MessageAlreadyExists`` and nothing sent if a key is taken."""
    decl = engine.declaration(model)
    names = key_names(model)
    connection = connections[engine.database]
    try:
        return client.commit_mutations(
            engine.spanner(),
            sends=[
                (
                    decl.name,
                    tuple(prep_key(model, [m.key[n] for n in names], connection)),
                    client.wire_payload(decl.payload_type, m.payload),
                    m.deliver_time,
                )
                for m in messages
            ],
        )
    except Exception as exc:
        if client.grpc_status(exc) == "ALREADY_EXISTS":
            raise MessageAlreadyExists(
                f"{model._meta.label}: a message with one of the keys "
                f"{[tuple(m.key.values()) for m in messages]!r} already exists; nothing "
                "was sent."
            ) from exc
        raise


def ack_mutations(
    engine: NativeQueueEngine,
    model: type[Queue],
    keys: Sequence[tuple[Any, ...]],
    *,
    ignore_not_found: bool = False,
) -> Any:
    """``Ack`` mutations in one batch commit, outside any Django transaction; the commit
    timestamp. ``NOT_FOUND`` (a missing message) raises ``MessageAlreadyAcked`` and nothing
    is acked, unless ``ignore_not_found``."""
    name = engine.declaration(model).name
    connection = connections[engine.database]
    try:
        return client.commit_mutations(
            engine.spanner(),
            acks=[
                (name, tuple(prep_key(model, k, connection)), ignore_not_found or None)
                for k in keys
            ],
        )
    except Exception as exc:
        if client.grpc_status(exc) == "NOT_FOUND":
            raise MessageAlreadyAcked(
                f"{model._meta.label}: Ack found no message for one of {list(keys)!r}; "
                "nothing was acked."
            ) from exc
        raise

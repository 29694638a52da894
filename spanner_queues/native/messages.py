"""Messages on the wire: key values as the client writes and reads them, and the writes of the
native engine: ``INSERT`` and ``DELETE ... ASSERT_ROWS_MODIFIED n`` DML through the caller's
Django connection and transaction (chunked under Spanner's 950-parameter limit), ``Send``/``Ack``
mutations in a read-write transaction of their own."""

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
from spanner_queues.native.ddl import MAX_QUERY_PARAMETERS

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


def chunks(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    """``items`` in consecutive slices of at most ``size`` (at least one item each)."""
    size = max(1, size)
    return [items[i : i + size] for i in range(0, len(items), size)]


def insert(
    engine: NativeQueueEngine,
    model: type[Queue],
    messages: Sequence[OutgoingMessage],
    *,
    using: str,
) -> list[Message]:
    """``INSERT`` the messages in one transaction (the caller's, when there is one): one
    statement per ``MAX_QUERY_PARAMETERS`` parameters, so any number of messages fits in one
    transaction (up to Spanner's commit limits)."""
    decl = engine.declaration(model)
    names = key_names(model)
    now = clock.now()
    # A deliver time that is missing or already past means "now": DeliverTime is omitted
    # and Spanner delivers at once (it replaces past times "with a value closer to now").
    later = [m for m in messages if m.deliver_time is not None and m.deliver_time > now]
    timed_ids = {id(m) for m in later}
    at_once = [m for m in messages if id(m) not in timed_ids]
    statements = []
    conn = connections[using]
    for group, timed in ((at_once, False), (later, True)):
        if not group:
            continue
        width = engine.cursor_dialect.insert_width(decl, with_deliver_time=timed)
        for chunk in chunks(group, MAX_QUERY_PARAMETERS // width):
            params: list[Any] = []
            for m in chunk:
                params.extend(prep_key(model, [m.key[n] for n in names], conn))
                params.append(client.wire_payload(decl.payload_type, m.payload))
                if timed:
                    params.append(m.deliver_time)
            sql = engine.cursor_dialect.insert(decl, len(chunk), with_deliver_time=timed)
            statements.append((sql, params))
    try:
        # One transaction for all statements (immediate and delayed messages, and each
        # chunk, are INSERTs of their own): all or nothing even outside the caller's
        # ``atomic``.
        with transaction.atomic(using=using), conn.cursor() as cursor:
            for sql, params in statements:
                cursor.execute(sql, params)
    except Exception as exc:
        keys = ", ".join(str(tuple(m.key.values())) for m in messages[:20])
        if len(messages) > 20:
            keys += f" (and {len(messages) - 20} more)"
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
            deliver_time=m.deliver_time if id(m) in timed_ids else now,
            send_time=now,
        )
        for m in messages
    ]


def delete(
    engine: NativeQueueEngine, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str
) -> None:
    """Ack, in one transaction (the caller's, when there is one): one ``DELETE ... WHERE
    <key> IN (...) ASSERT_ROWS_MODIFIED n`` per ``MAX_QUERY_PARAMETERS`` key values (one
    round trip for a receiver's batch), ``DELETE ... ASSERT_ROWS_MODIFIED 1`` for one key. A
    missing message (or a key given twice) fails the statement with ``OUT_OF_RANGE``: the
    transaction is marked for rollback and ``MessageAlreadyAcked`` raised. The assertion is
    the server's, so a transaction the DB-API replays after an abort checks it again."""
    if not keys:
        return
    decl = engine.declaration(model)
    conn = connections[using]
    with transaction.atomic(using=using), conn.cursor() as cursor:
        for chunk in chunks(keys, MAX_QUERY_PARAMETERS // max(1, len(decl.keys))):
            params = [v for key in chunk for v in prep_key(model, key, conn)]
            try:
                cursor.execute(engine.cursor_dialect.ack_many(decl, len(chunk)), params)
            except Exception as exc:
                if client.grpc_status(exc) != "OUT_OF_RANGE":
                    raise
                # Statement-level on Spanner: the transaction would still commit the
                # caller's other writes. Never continue it: mark it for rollback.
                transaction.set_rollback(True, using=using)
                which = (
                    f"{tuple(chunk[0])!r}: no such message"
                    if len(chunk) == 1
                    else f": one of {list(chunk)!r} is no such message (or came twice)"
                )
                raise MessageAlreadyAcked(
                    f"{model._meta.label}{which}; it was already acked (or deleted). Roll "
                    "back: the work may have been done by another receiver."
                ) from exc


def send_mutations(
    engine: NativeQueueEngine, model: type[Queue], messages: Sequence[OutgoingMessage]
) -> Any:
    """``Send`` mutations committed together, outside any Django transaction, in a read-write
    transaction of their own (``client.commit_mutations``: safe to retry); the commit
    timestamp. ``MessageAlreadyExists`` and nothing sent if a key is taken;
    ``CommitOutcomeUnknown`` if the commit's answer was lost."""
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
        if driver_for(engine.database).is_missing_parent(exc):
            raise InvalidMessage(
                f"{model._meta.label}: no parent row for one of the keys "
                f"{[tuple(m.key.values()) for m in messages]!r} (the queue is interleaved "
                "in its parent; create the parent first); nothing was sent."
            ) from exc
        raise


def ack_mutations(
    engine: NativeQueueEngine,
    model: type[Queue],
    keys: Sequence[tuple[Any, ...]],
    *,
    ignore_not_found: bool = False,
) -> Any:
    """``Ack`` mutations committed together, outside any Django transaction, in a read-write
    transaction of their own (``client.commit_mutations``: safe to retry); the commit
    timestamp. ``NOT_FOUND: Message not found`` raises ``MessageAlreadyAcked`` and nothing is
    acked, unless ``ignore_not_found``; ``CommitOutcomeUnknown`` if the commit's answer was
    lost."""
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
        if client.grpc_status(exc) == "NOT_FOUND" and "message not found" in str(exc).lower():
            raise MessageAlreadyAcked(
                f"{model._meta.label}: Ack found no message for one of {list(keys)!r}; "
                "nothing was acked."
            ) from exc
        raise

"""What a queue does, on the table that stores it: claim (RECEIVE), renew (RENEWLEASE), and the
``Send``/``Ack`` mutations as ordinary writes.

- A claim leases up to ``max_batch_size`` due rows in one read-write transaction: due means
  ``DeliverTime <= now`` and, for a message leased before, its hidden next-delivery time has
  come. Each gets a new lease token, a lease 10 s long, one more attempt, and a next-delivery
  time of the lease expiry plus the back-off for that attempt (the table engine's curve,
  ``spanner_queues_emulator.semantics``), so an unacked message comes back after the back-off.
  ``DeliverTime`` itself keeps the sender's time (``kept``, the default), unless the front is
  told to play another answer Google leaves open (``DELIVER_TIME_MODES``: ``--deliver-time``,
  ``SPANNER_QUEUES_EMULATOR_DELIVER_TIME``, ``FrontControl.configure(deliver_time=...)``):
  ``lease_expiry`` moves it to the lease's expiry on each lease (a claim or a renewal),
  ``next_due`` to the time the message is next due (the expiry plus the back-off); the row
  ``RECEIVE`` returns, and every later read, shows the moved value.
- A lease token names its queue, key and expiry (opaque to clients) and carries a digest of
  them, so ``RENEWLEASE`` answers as documented without any state in the front: no row for an
  unparseable (or altered) or expired token; for one still within its lease whose message was
  acked (or re-sent), a row with a NULL new token and the expiry of the lease it still holds;
  else a rotated token and a lease 10 s from now. A bad token never fails the call.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from google.protobuf import json_format

from spanner_queues_emulator import backend as b
from spanner_queues_emulator.schema import (
    ATTEMPTS,
    DELIVER_TIME,
    LEASE_EXPIRES,
    LEASE_TOKEN,
    NEXT_DELIVERY,
    PAYLOAD,
    SEND_TIME,
    QueueSchema,
)
from spanner_queues_emulator.semantics import LEASE, BackoffPolicy

UTC = timezone.utc
BACKOFF = BackoffPolicy()
#: when a message is due: its DeliverTime, or later while leased and backing off.
_DUE = f"GREATEST({DELIVER_TIME}, IFNULL({NEXT_DELIVERY}, {DELIVER_TIME}))"

#: what a lease does to a message's ``DeliverTime`` (see the module docstring); the first is the
#: default.
DELIVER_TIME_MODES = ("kept", "lease_expiry", "next_due")
#: the environment variable that chooses the mode of ``python -m spanner_queues_emulator`` and
#: of ``QueueEmulator`` when none is given.
DELIVER_TIME_ENV = "SPANNER_QUEUES_EMULATOR_DELIVER_TIME"


def deliver_time_mode(value: str | None = None) -> str:
    """``value``, else ``DELIVER_TIME_ENV``, else ``kept``; ``ValueError`` when it is not one
    of ``DELIVER_TIME_MODES``."""
    mode = value if value is not None else os.environ.get(DELIVER_TIME_ENV) or "kept"
    if mode not in DELIVER_TIME_MODES:
        raise ValueError(
            f"deliver_time must be one of {', '.join(DELIVER_TIME_MODES)}, not {mode!r}"
        )
    return mode


def moved_deliver_time(mode: str, expires: datetime, next_due: datetime) -> datetime | None:
    """The ``DeliverTime`` a lease ending at ``expires`` (the message next due at
    ``next_due``) gives its message in ``mode``; None: kept as it is."""
    if mode == "lease_expiry":
        return expires
    if mode == "next_due":
        return next_due
    return None


RECEIVE_SYSTEM = ("SpannerLeaseExpirationTimestamp", "SpannerLeaseToken", "SpannerLastBatchMessage")
RENEW_COLUMNS = ("SpannerOldLeaseToken", "SpannerNewLeaseToken", "SpannerLeaseExpirationTimestamp")


class QueueRefusal(Exception):
    """A queue request Spanner refuses: ``code`` is the gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# --- wire values -------------------------------------------------------------------------
def ts(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_ts(text: str) -> datetime:
    main, _, frac = text.rstrip("Z").partition(".")
    return datetime.strptime(main, "%Y-%m-%dT%H:%M:%S").replace(
        microsecond=int((frac + "000000")[:6]), tzinfo=UTC
    )


def now() -> datetime:
    return datetime.now(UTC)


def quote(name: str) -> str:
    return "`" + name.replace("`", "") + "`"


# --- lease tokens ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Token:
    queue: str
    key: Any  # ListValue
    expires: datetime
    text: str


def _digest(body: dict[str, Any]) -> str:
    parts = json.dumps([body.get(k) for k in ("q", "k", "e", "n")], separators=(",", ":"))
    return hashlib.sha256(parts.encode()).hexdigest()[:16]


def make_token(queue: str, key: Sequence[Any], expires: datetime) -> str:
    key_list = b.ListValue(values=list(key))
    body: dict[str, Any] = {
        "q": queue.upper(),
        "k": json_format.MessageToDict(key_list),
        "e": ts(expires),
        "n": secrets.token_hex(8),
    }
    body["d"] = _digest(body)
    return base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode()


def read_token(text: Any) -> Token | None:
    """The token's parts; None when it is not one of this front's tokens (not base64 JSON,
    a part missing, or parts that do not match its digest: altered or forged)."""
    if not isinstance(text, str):
        return None
    try:
        body = json.loads(base64.urlsafe_b64decode(text.encode()))
        if body["d"] != _digest(body):
            return None
        key = json_format.ParseDict(body["k"], b.ListValue())
        return Token(str(body["q"]), key, parse_ts(body["e"]), text)
    except Exception:
        return None


_KEY_KINDS = {"BOOL": "bool_value", "FLOAT64": "number_value", "FLOAT32": "number_value"}


def key_fits(queue: QueueSchema, key: Any) -> bool:
    """Whether ``key`` (a ``ListValue``) has one value of the wire kind of each key column of
    ``queue`` (``string_value`` for INT64, STRING, BYTES, TIMESTAMP, DATE, NUMERIC; a float may
    also be ``'NaN'``/``'Infinity'``); NULL fits any column."""
    if len(key.values) != len(queue.keys):
        return False
    for value, type_ in zip(key.values, queue.key_types, strict=True):
        kind = value.WhichOneof("kind")
        base = type_.split("(")[0].upper()
        if kind == "null_value":
            continue
        if base in ("FLOAT64", "FLOAT32") and kind == "string_value":
            if value.string_value not in ("NaN", "Infinity", "-Infinity"):
                return False
            continue
        if kind != _KEY_KINDS.get(base, "string_value"):
            return False
        if base == "INT64" and not (
            _INT64.fullmatch(value.string_value) and -(2**63) <= int(value.string_value) < 2**63
        ):
            return False
    return True


_INT64 = re.compile(r"-?\d{1,19}")


# --- RECEIVE -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Claimed:
    fields: list[tuple[str, Any]]  # (name, Type) of the RECEIVE row
    rows: list[list[Any]]  # protobuf Values in ``fields`` order


def has_due(backend: b.Backend, database: str, queue: QueueSchema) -> datetime | None:
    """The earliest ``DeliverTime`` of the queue (a strong read, no lock), None if empty."""
    with backend.session(database) as session:
        result = backend.query(session, f"SELECT MIN({_DUE}) FROM {quote(queue.name)}")
    value = result.rows[0].values[0] if result.rows else None
    if value is None or value.WhichOneof("kind") != "string_value":
        return None
    return parse_ts(value.string_value)


def claim(
    backend: b.Backend,
    database: str,
    queue: QueueSchema,
    limit: int,
    backoff: BackoffPolicy = BACKOFF,
    deliver_time: str = "kept",
) -> Claimed:
    """Lease up to ``limit`` due messages in one read-write transaction (``backoff``: when an
    unacked one is due again, ``answers``; ``deliver_time``: what the lease does to their
    ``DeliverTime``, one of ``DELIVER_TIME_MODES``)."""
    keys = [quote(k) for k in queue.keys]
    sql = (
        f"SELECT {', '.join(keys)}, {PAYLOAD}, {DELIVER_TIME}, {ATTEMPTS}, {SEND_TIME} "
        f"FROM {quote(queue.name)} WHERE {_DUE} <= @now "
        f"ORDER BY {_DUE} LIMIT {int(limit)}"
    )
    n = len(queue.keys)

    def work(session: str, txn: b.Txn) -> tuple[Claimed, list[Any]]:
        at = now()
        result = backend.query(
            session,
            sql,
            transaction_id=txn,
            params={"now": (b.Value(string_value=ts(at)), b.TypeCode.TIMESTAMP)},
        )
        fields = [(f.name, f.type_) for f in result.metadata.row_type.fields[: n + 2]]
        fields += [
            (RECEIVE_SYSTEM[0], b.field_type(b.TypeCode.TIMESTAMP)),
            (RECEIVE_SYSTEM[1], b.field_type(b.TypeCode.STRING)),
            (RECEIVE_SYSTEM[2], b.field_type(b.TypeCode.BOOL)),
        ]
        out, updates = [], []
        rows = b.rows(result)
        for i, row in enumerate(rows):
            update, leased = _lease_row(
                queue,
                row,
                at,
                last=i == len(rows) - 1,
                backoff=backoff,
                deliver_time=deliver_time,
            )
            updates.append(update)
            out.append(leased)
        mutations = []
        if updates:
            mutations.append(
                b.update_mutation(
                    queue.name,
                    [*queue.keys, NEXT_DELIVERY, LEASE_TOKEN, LEASE_EXPIRES, ATTEMPTS]
                    + ([DELIVER_TIME] if deliver_time != "kept" else []),
                    updates,
                )
            )
        return Claimed(fields, out), mutations

    return backend.run_in_transaction(database, work)


def _lease_row(
    queue: QueueSchema,
    row: list[Any],
    at: datetime,
    *,
    last: bool,
    backoff: BackoffPolicy = BACKOFF,
    deliver_time: str = "kept",
) -> tuple[list[Any], list[Any]]:
    """Lease one due ``row`` (keys, payload, deliver time, attempts, send time) at ``at``:
    the row's update (its next delivery after the back-off of this attempt, the token, the
    lease's end, the attempt, its deliver time as ``deliver_time`` says) and the row
    ``RECEIVE`` returns (keys, payload, deliver time, the lease's end, the token, whether it
    ends the batch)."""
    n = len(queue.keys)
    expires = at + LEASE
    attempt = int(row[n + 2].string_value or 0) + 1
    sent = row[n + 3]
    age = at - parse_ts(sent.string_value) if sent.HasField("string_value") else timedelta(0)
    token = make_token(queue.name, row[:n], expires)
    deliver = expires + backoff.delay(attempt, age)
    moved = moved_deliver_time(deliver_time, expires, deliver)
    shown = b.Value(string_value=ts(moved)) if moved is not None else row[n + 1]
    update = [
        *row[:n],
        b.Value(string_value=ts(deliver)),
        b.Value(string_value=token),
        b.Value(string_value=ts(expires)),
        b.Value(string_value=str(attempt)),
        *([shown] if moved is not None else []),
    ]
    leased = [
        *row[:n],
        row[n],
        shown,
        b.Value(string_value=ts(expires)),
        b.Value(string_value=token),
        b.bool_value(last),
    ]
    return update, leased


# --- RENEWLEASE --------------------------------------------------------------------------
def renew(
    backend: b.Backend,
    database: str,
    queue: QueueSchema,
    tokens: Sequence[Any],
    backoff: BackoffPolicy = BACKOFF,
    deliver_time: str = "kept",
) -> list[list[Any]]:
    """Rows of ``RENEWLEASE_<Q>`` for ``tokens``: (old, new or NULL, expiry); ``deliver_time``:
    what the renewed lease does to a message's ``DeliverTime`` (``DELIVER_TIME_MODES``)."""
    parsed = [read_token(t) for t in tokens]
    live = [
        t
        for t in parsed
        if t is not None and t.queue == queue.name.upper() and key_fits(queue, t.key)
    ]
    n = len(queue.keys)
    columns = [*queue.keys, LEASE_TOKEN, LEASE_EXPIRES, ATTEMPTS, SEND_TIME]

    def work(session: str, txn: b.Txn) -> tuple[list[list[Any]], list[Any]]:
        at = now()
        current: dict[str, list[Any]] = {}
        if live:
            result = backend.read(
                session, queue.name, columns, [t.key for t in live], transaction_id=txn
            )
            for read in b.rows(result):
                token = read[n].string_value if read[n].HasField("string_value") else None
                if token:
                    current[token] = read
        out, updates = [], []
        for token in live:
            if token.expires <= at:
                continue  # expired: no row
            row = current.get(token.text)
            if row is None:  # acked, or acked and sent again: valid but not renewable
                out.append(
                    [
                        b.Value(string_value=token.text),
                        b.string_value(None),
                        b.Value(string_value=ts(token.expires)),  # the lease it still holds
                    ]
                )
                continue
            update, renewed = _renew_row(queue, row, token.text, at, backoff, deliver_time)
            updates.append(update)
            out.append(renewed)
        mutations = []
        if updates:
            mutations.append(
                b.update_mutation(
                    queue.name,
                    [*queue.keys, NEXT_DELIVERY, LEASE_TOKEN, LEASE_EXPIRES]
                    + ([DELIVER_TIME] if deliver_time != "kept" else []),
                    updates,
                )
            )
        return out, mutations

    return backend.run_in_transaction(database, work)


def _renew_row(
    queue: QueueSchema,
    row: list[Any],
    old: str,
    at: datetime,
    backoff: BackoffPolicy = BACKOFF,
    deliver_time: str = "kept",
) -> tuple[list[Any], list[Any]]:
    """Renew the lease of ``row`` (keys, token, lease's end, attempts, send time), held by
    token ``old``, at ``at``: the row's update (its next delivery after the back-off, the new
    token, the lease's end, its deliver time as ``deliver_time`` says) and
    the row ``RENEWLEASE`` returns (old, new, expiry)."""
    n = len(queue.keys)
    expires = at + LEASE
    attempt = int(row[n + 2].string_value or 1)
    sent = row[n + 3]
    age = at - parse_ts(sent.string_value) if sent.HasField("string_value") else timedelta(0)
    new = make_token(queue.name, row[:n], expires)
    deliver = expires + backoff.delay(attempt, age)
    moved = moved_deliver_time(deliver_time, expires, deliver)
    update = [
        *row[:n],
        b.Value(string_value=ts(deliver)),
        b.Value(string_value=new),
        b.Value(string_value=ts(expires)),
        *([b.Value(string_value=ts(moved))] if moved is not None else []),
    ]
    renewed = [
        b.Value(string_value=old),
        b.Value(string_value=new),
        b.Value(string_value=ts(expires)),
    ]
    return update, renewed


def renew_fields() -> list[tuple[str, Any]]:
    return [
        (RENEW_COLUMNS[0], b.field_type(b.TypeCode.STRING)),
        (RENEW_COLUMNS[1], b.field_type(b.TypeCode.STRING)),
        (RENEW_COLUMNS[2], b.field_type(b.TypeCode.TIMESTAMP)),
    ]


def receive_names(queue: QueueSchema) -> list[str]:
    """The columns of ``RECEIVE_<queue>``, in ``SELECT *`` order."""
    return [*queue.keys, PAYLOAD, DELIVER_TIME, *RECEIVE_SYSTEM]


def check_columns(names: Sequence[str], columns: Sequence[str] | None) -> None:
    """Refuse a column of ``columns`` that is not among ``names`` (case-insensitive), as
    Spanner does: ``INVALID_ARGUMENT`` "Unrecognized name"."""
    known = {name.upper() for name in names}
    for column in columns or ():
        if column.upper() not in known:
            raise QueueRefusal("INVALID_ARGUMENT", f"Unrecognized name: {column}")


def project(
    fields: list[tuple[str, Any]], rows: list[list[Any]], columns: Sequence[str] | None
) -> tuple[list[tuple[str, Any]], list[list[Any]]]:
    """Keep ``columns`` (by name, case-insensitive; None = all) of each row."""
    if columns is None:
        return fields, rows
    index = {name.upper(): i for i, (name, _) in enumerate(fields)}
    picks = []
    for column in columns:
        if column.upper() not in index:
            raise QueueRefusal("INVALID_ARGUMENT", f"Unrecognized name: {column}")
        picks.append(index[column.upper()])
    return [fields[i] for i in picks], [[row[i] for i in picks] for row in rows]


def metadata(fields: list[tuple[str, Any]]) -> Any:
    meta = b.ResultSetMetadata()
    for name, type_ in fields:
        f = meta.row_type.fields.add()
        f.name = name
        f.type_.CopyFrom(type_)
    return meta


# --- Send / Ack mutations ----------------------------------------------------------------
@dataclass
class Translated:
    mutations: list[Any]
    #: (queue, key ListValue) of each Ack that must find its message
    must_exist: list[tuple[QueueSchema, Any]]
    queues: set[str]


def translate_mutations(mutations: Sequence[Any], catalog: dict[str, QueueSchema]) -> Translated:
    """``Send`` -> insert (``DeliverTime`` now when unset or past), ``Ack`` -> delete; other
    writes to a queue are refused, as on Spanner."""
    out: list[Any] = []
    must_exist: list[tuple[QueueSchema, Any]] = []
    queues: set[str] = set()
    at = now()
    for m in mutations:
        op = m.WhichOneof("operation")
        if op in ("send", "ack"):
            body = getattr(m, op)
            queue = catalog.get(body.queue.upper())
            if queue is None:
                raise QueueRefusal("NOT_FOUND", f"Queue not found: {body.queue}")
            if len(body.key.values) != len(queue.keys):
                raise QueueRefusal(
                    "INVALID_ARGUMENT",
                    f"{op.capitalize()} to {queue.name}: the key has {len(body.key.values)} "
                    f"values; the queue's primary key has {len(queue.keys)} columns",
                )
            queues.add(queue.name.upper())
            if op == "send":
                if not body.HasField("payload"):
                    raise QueueRefusal(
                        "INVALID_ARGUMENT", f"Send to {queue.name}: a payload is required"
                    )
                deliver = at
                if body.HasField("deliver_time"):
                    deliver = max(body.deliver_time.ToDatetime(tzinfo=UTC), at)
                write = b.Mutation.Write(
                    table=queue.name, columns=[*queue.keys, PAYLOAD, DELIVER_TIME]
                )
                write.values.add().values.extend(
                    [*body.key.values, body.payload, b.Value(string_value=ts(deliver))]
                )
                out.append(b.Mutation(insert=write))
            else:
                delete = b.Mutation.Delete(table=queue.name)
                delete.key_set.keys.add().CopyFrom(body.key)
                out.append(b.Mutation(delete=delete))
                if not body.ignore_not_found:
                    must_exist.append((queue, body.key))
            continue
        if op in ("insert", "update", "insert_or_update", "replace"):
            table = getattr(m, op).table
            if table.upper() in catalog:
                raise QueueRefusal(
                    "INVALID_ARGUMENT",
                    f"{op} mutations are not supported on queue {table}: send with a Send "
                    "mutation or INSERT, replace a message with Ack then Send",
                )
        out.append(m)
    return Translated(out, must_exist, queues)


def missing_acks(
    backend: b.Backend,
    session: str,
    transaction_id: bytes | b.Txn,
    must_exist: Sequence[tuple[QueueSchema, Any]],
) -> list[tuple[QueueSchema, Any]]:
    """The Acks among ``must_exist`` whose message is not there, read in the transaction."""
    missing = []
    by_queue: dict[str, list[tuple[QueueSchema, Any]]] = {}
    for queue, key in must_exist:
        by_queue.setdefault(queue.name, []).append((queue, key))
    for items in by_queue.values():
        queue = items[0][0]
        result = backend.read(
            session,
            queue.name,
            list(queue.keys),
            [k for _, k in items],
            transaction_id=transaction_id,
        )
        found = {
            json.dumps(json_format.MessageToDict(b.ListValue(values=list(r.values))))
            for r in result.rows
        }
        for item in items:
            if json.dumps(json_format.MessageToDict(item[1])) not in found:
                missing.append(item)
    return missing

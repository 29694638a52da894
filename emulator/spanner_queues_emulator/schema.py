"""Queue DDL for the emulator front: ``CREATE QUEUE`` becomes a table the emulator can hold.

A queue ``Q`` is stored as a table with the same key columns and ``Payload``, plus
``DeliverTime`` (defaulting to the commit's ``CURRENT_TIMESTAMP()``; it keeps the time the
sender chose) and hidden bookkeeping columns that ``SELECT *`` never shows (lease token and
expiry, attempts, send time, and when an unacked message may be delivered again). The hidden
columns also mark the table as a queue, so the catalog of queues is read back from the
emulator's own DDL (``catalog_from_ddl``) and survives a restart of the front.
``GetDatabaseDdl`` answers with the queue as declared.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

#: hidden bookkeeping columns of a queue's table (GoogleSQL spelling).
LEASE_TOKEN = "SpannerQueueLeaseToken"
LEASE_EXPIRES = "SpannerQueueLeaseExpiration"
ATTEMPTS = "SpannerQueueAttempts"
SEND_TIME = "SpannerQueueSendTime"
#: when a leased (or once leased) message may be delivered again: lease expiry + back-off.
NEXT_DELIVERY = "SpannerQueueNextDelivery"
HIDDEN_COLUMNS = (LEASE_TOKEN, LEASE_EXPIRES, ATTEMPTS, SEND_TIME, NEXT_DELIVERY)
DELIVER_TIME = "DeliverTime"
PAYLOAD = "Payload"

_HIDDEN_DDL = (
    f"{DELIVER_TIME} TIMESTAMP NOT NULL DEFAULT (CURRENT_TIMESTAMP())",
    f"{SEND_TIME} TIMESTAMP DEFAULT (CURRENT_TIMESTAMP()) HIDDEN",
    f"{ATTEMPTS} INT64 HIDDEN",
    f"{LEASE_TOKEN} STRING(MAX) HIDDEN",
    f"{LEASE_EXPIRES} TIMESTAMP HIDDEN",
    f"{NEXT_DELIVERY} TIMESTAMP HIDDEN",
)


class QueueDdlError(ValueError):
    """A queue statement the front cannot parse; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class QueueSchema:
    """One queue: its name as declared, key columns in key order, and payload type."""

    name: str
    keys: tuple[str, ...]
    key_types: tuple[str, ...]
    payload_type: str
    #: the ``CREATE QUEUE`` statement as the client sent it, when this front saw it.
    declared: str | None = None
    options: str | None = field(default=None, compare=False)

    @property
    def payload_is_bytes(self) -> bool:
        return self.payload_type.upper().startswith("BYTES")


# --- lexing ------------------------------------------------------------------------------
_TOKEN = re.compile(
    r"""\s+|--[^\n]*|\#[^\n]*|/\*.*?\*/
    |(?P<str>'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*")
    |(?P<quoted>`(?:\\.|[^`\\])*`)
    |(?P<word>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<other>.)""",
    re.S | re.X,
)


def strip_comments(sql: str) -> str:
    """``sql`` with comments replaced by a space (strings left alone)."""
    out = []
    for m in _TOKEN.finditer(sql):
        text = m.group(0)
        out.append(" " if text.startswith(("--", "#", "/*")) else text)
    return "".join(out)


def code_only(sql: str) -> str:
    """``sql`` with comments replaced by a space and every string literal by ``''``: what is
    left is the statement's code (keywords, names, operators), to look for calls in."""
    out = []
    for m in _TOKEN.finditer(sql):
        text = m.group(0)
        if m.group("str"):
            out.append("''")
        else:
            out.append(" " if text.startswith(("--", "#", "/*")) else text)
    return "".join(out)


def quote_name(name: str) -> str:
    """``name`` as an identifier in the DDL and SQL the front sends: always backquoted, so
    reserved words (``Order``) and names the emulator prints bare (``my-q``) both work."""
    return "`" + name.replace("`", "") + "`"


def words(sql: str) -> list[str]:
    """Upper-cased words and single characters of ``sql``, strings and comments dropped."""
    out = []
    for m in _TOKEN.finditer(sql):
        if m.group("word"):
            out.append(m.group("word").upper())
        elif m.group("quoted"):
            out.append(m.group("quoted")[1:-1].upper())
        elif m.group("other"):
            out.append(m.group("other"))
    return out


def unquote(name: str) -> str:
    name = name.strip()
    if name.startswith("`") and name.endswith("`"):
        return name[1:-1]
    if name.startswith('"') and name.endswith('"'):
        return name[1:-1]
    return name


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside parentheses, brackets and strings."""
    parts, depth, start = [], 0, 0
    for m in _TOKEN.finditer(text):
        ch = m.group("other")
        if ch in ("(", "["):
            depth += 1
        elif ch in (")", "]"):
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start : m.start()])
            start = m.end()
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _matching_paren(text: str, open_at: int) -> int:
    depth = 0
    for m in _TOKEN.finditer(text, open_at):
        ch = m.group("other")
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return m.start()
    raise QueueDdlError("unbalanced parentheses")


# --- CREATE QUEUE ------------------------------------------------------------------------
_CREATE_QUEUE = re.compile(
    r"^\s*CREATE\s+QUEUE\s+(?P<ine>IF\s+NOT\s+EXISTS\s+)?(?P<name>`[^`]+`|[A-Za-z_]\w*)\s*\(",
    re.I,
)
_DROP_QUEUE = re.compile(
    r"^\s*DROP\s+QUEUE\s+(?P<ie>IF\s+EXISTS\s+)?(?P<name>`[^`]+`|[A-Za-z_]\w*)\s*$", re.I
)
_ALTER_QUEUE = re.compile(
    r"^\s*ALTER\s+QUEUE\s+(?P<name>`[^`]+`|[A-Za-z_]\w*)\s+(?P<rest>.*)$", re.I | re.S
)
_PRIMARY_KEY = re.compile(r"^\s*PRIMARY\s+KEY\s*\(", re.I)
_OPTIONS = re.compile(r"^\s*OPTIONS\s*\(", re.I)


def is_queue_statement(statement: str) -> bool:
    text = strip_comments(statement)
    return bool(_CREATE_QUEUE.match(text) or _DROP_QUEUE.match(text) or _ALTER_QUEUE.match(text))


def _column_def(text: str) -> tuple[str, str, str]:
    """``(name, type, rest)`` of one column definition."""
    m = re.match(
        r"\s*(`[^`]+`|[^\s`]+)\s+(\w+(?:\s*\(\s*\w+\s*\))?|ARRAY\s*<[^>]+>)(.*)$",
        text,
        re.S | re.I,
    )
    if not m:
        raise QueueDdlError(f"cannot read the column definition {text!r}")
    return unquote(m.group(1)), re.sub(r"\s+", "", m.group(2)).upper(), m.group(3)


def parse_create_queue(statement: str) -> tuple[QueueSchema, str]:
    """Parse a GoogleSQL ``CREATE QUEUE``; return the queue and the ``CREATE TABLE`` that
    stores it on the emulator."""
    text = strip_comments(statement).strip().rstrip(";")
    m = _CREATE_QUEUE.match(text)
    if not m:
        raise QueueDdlError("not a CREATE QUEUE statement")
    name = unquote(m.group("name"))
    close = _matching_paren(text, m.end() - 1)
    keys, payload = _queue_columns(name, split_top_level(text[m.end() : close]))
    tail = text[close + 1 :]
    pk = _PRIMARY_KEY.match(tail)
    if not pk:
        raise QueueDdlError(f"queue {name}: PRIMARY KEY (...) must follow the columns")
    pk_close = _matching_paren(tail, pk.end() - 1)
    key_order = [
        unquote(re.sub(r"\s+(ASC|DESC)\s*$", "", k, flags=re.I))
        for k in split_top_level(tail[pk.end() : pk_close])
    ]
    _check_primary_key(name, key_order, keys)
    declared_keys = {k[0].upper(): k for k in keys}
    table_clauses, options = _queue_clauses(name, split_top_level(tail[pk_close + 1 :]))
    body = [k[2] for k in keys] + [f"{payload[0]} {payload[1]}{payload[2]}", *_HIDDEN_DDL]
    table = (
        f"CREATE TABLE {'IF NOT EXISTS ' if m.group('ine') else ''}{quote_name(name)} (\n  "
        + ",\n  ".join(b.strip() for b in body)
        + f"\n) {tail[: pk_close + 1].strip()}"
    )
    if table_clauses:
        table += ", " + ", ".join(table_clauses)
    schema = QueueSchema(
        name=name,
        keys=tuple(key_order),
        key_types=tuple(declared_keys[k.upper()][1] for k in key_order),
        payload_type=payload[1],
        declared=statement.strip().rstrip(";"),
        options=options,
    )
    return schema, table


def _queue_columns(
    name: str, columns: list[str]
) -> tuple[list[tuple[str, str, str]], tuple[str, str, str]]:
    """The key columns (name, type, definition) and the ``Payload`` column (name, type, the
    rest of its definition) of queue ``name``: one ``Payload``, ``NOT NULL``, of a type
    Spanner allows; no system column declared."""
    keys: list[tuple[str, str, str]] = []
    payload: tuple[str, str, str] | None = None
    for col in columns:
        col_name, col_type, rest = _column_def(col)
        if col_name.upper() == PAYLOAD.upper():
            if payload is not None:
                raise QueueDdlError(f"queue {name} declares Payload twice")
            if not re.match(r"^(BYTES|STRING)\((\d+|MAX)\)$|^JSON$", col_type):
                raise QueueDdlError(
                    f"queue {name}: Payload must be BYTES(n|MAX), STRING(n|MAX) or JSON, "
                    f"not {col_type}"
                )
            if not re.search(r"\bNOT\s+NULL\b", rest, re.I):
                raise QueueDdlError(f"queue {name}: Payload must be NOT NULL")
            payload = (col_name, col_type, rest)
        elif col_name.upper() in {DELIVER_TIME.upper(), *(h.upper() for h in HIDDEN_COLUMNS)}:
            raise QueueDdlError(f"queue {name}: {col_name} is a system column; do not declare it")
        else:
            keys.append((col_name, col_type, col))
    if payload is None:
        raise QueueDdlError(f"queue {name} has no Payload column")
    return keys, payload


def _check_primary_key(name: str, key_order: list[str], keys: list[tuple[str, str, str]]) -> None:
    """The primary key of queue ``name`` is every declared column but ``Payload``."""
    declared_keys = {k[0].upper(): k for k in keys}
    if not key_order:
        raise QueueDdlError(f"queue {name}: PRIMARY KEY needs at least one column")
    for k in key_order:
        if k.upper() not in declared_keys:
            raise QueueDdlError(f"queue {name}: key column {k} is not declared")
    if len(key_order) != len(keys):
        extra = sorted(set(declared_keys) - {k.upper() for k in key_order})
        raise QueueDdlError(
            f"queue {name}: every column but Payload must be part of the primary key "
            f"(not: {', '.join(extra)})"
        )


def _queue_clauses(name: str, clauses: list[str]) -> tuple[list[str], str | None]:
    """The clauses after the primary key: the table's (``INTERLEAVE IN``, ``ROW DELETION
    POLICY``) and the queue's ``OPTIONS``."""
    table_clauses, options = [], None
    for clause in clauses:
        if _OPTIONS.match(clause):
            options = clause
        elif re.match(r"^\s*(INTERLEAVE\s+IN|ROW\s+DELETION\s+POLICY)\b", clause, re.I):
            table_clauses.append(clause)
        else:
            raise QueueDdlError(f"queue {name}: unexpected clause {clause!r}")
    return table_clauses, options


def parse_drop_queue(statement: str) -> tuple[str, str]:
    """``DROP QUEUE [IF EXISTS] q`` -> (queue name, ``DROP TABLE`` statement)."""
    m = _DROP_QUEUE.match(strip_comments(statement).strip().rstrip(";"))
    if not m:
        raise QueueDdlError("not a DROP QUEUE statement")
    name = unquote(m.group("name"))
    return name, f"DROP TABLE {'IF EXISTS ' if m.group('ie') else ''}{quote_name(name)}"


def parse_alter_queue(statement: str) -> tuple[str, str | None, str | None]:
    """``ALTER QUEUE q <action>`` -> (queue, ``ALTER TABLE`` statement or None, new OPTIONS
    clause or None). ``SET OPTIONS`` is kept by the front; interleave and row deletion policy
    actions become ``ALTER TABLE``."""
    m = _ALTER_QUEUE.match(strip_comments(statement).strip().rstrip(";"))
    if not m:
        raise QueueDdlError("not an ALTER QUEUE statement")
    name, rest = unquote(m.group("name")), m.group("rest").strip()
    if re.match(r"^SET\s+OPTIONS\s*\(", rest, re.I):
        return name, None, rest[len("SET ") :].strip()
    if re.match(r"^(SET\s+ON\s+DELETE|(ADD|DROP|REPLACE)\s+ROW\s+DELETION\s+POLICY)", rest, re.I):
        return name, f"ALTER TABLE {quote_name(name)} {rest}", None
    raise QueueDdlError(f"ALTER QUEUE {name}: the front does not emulate {rest.split()[0]} ...")


# --- the catalog, read back from the emulator's DDL --------------------------------------
#: the emulator prints names bare unless they are reserved words: ``CREATE TABLE my-q (``.
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s+(`[^`]+`|[^\s(`]+)\s*\(", re.I)


def queue_from_table_ddl(statement: str) -> QueueSchema | None:
    """The queue a ``CREATE TABLE`` of ``GetDatabaseDdl`` stores, or None for a plain table."""
    m = _CREATE_TABLE.match(statement)
    if not m:
        return None
    close = _matching_paren(statement, m.end() - 1)
    columns = [_column_def(c) for c in split_top_level(statement[m.end() : close])]
    names = {c[0].upper() for c in columns}
    if not {h.upper() for h in HIDDEN_COLUMNS} <= names:
        return None
    tail = statement[close + 1 :]
    pk = _PRIMARY_KEY.match(tail)
    if not pk:
        return None
    pk_close = _matching_paren(tail, pk.end() - 1)
    key_order = tuple(
        unquote(re.sub(r"\s+(ASC|DESC)\s*$", "", k, flags=re.I))
        for k in split_top_level(tail[pk.end() : pk_close])
    )
    types = {c[0].upper(): c[1] for c in columns}
    payload = next(c for c in columns if c[0].upper() == PAYLOAD.upper())
    return QueueSchema(
        name=unquote(m.group(1)),
        keys=key_order,
        key_types=tuple(types[k.upper()] for k in key_order),
        payload_type=payload[1],
    )


def queue_ddl_from_table(statement: str) -> str:
    """A ``CREATE QUEUE`` rebuilt from the table that stores the queue (system columns out)."""
    m = _CREATE_TABLE.match(statement)
    assert m is not None
    close = _matching_paren(statement, m.end() - 1)
    system = {DELIVER_TIME.upper(), *(h.upper() for h in HIDDEN_COLUMNS)}
    kept = [
        c
        for c in split_top_level(statement[m.end() : close])
        if _column_def(c)[0].upper() not in system
    ]
    name = m.group(1)
    if not re.fullmatch(r"`[^`]+`|[A-Za-z_]\w*", name):
        name = quote_name(name)
    return f"CREATE QUEUE {name} (\n  " + ",\n  ".join(kept) + "\n)" + statement[close + 1 :]


def catalog_from_ddl(statements: Iterable[str]) -> dict[str, QueueSchema]:
    """Queues (by upper-cased name) among the emulator's DDL statements."""
    out = {}
    for statement in statements:
        queue = queue_from_table_ddl(statement)
        if queue is not None:
            out[queue.name.upper()] = queue
    return out


def present_ddl(statements: Iterable[str], known: dict[str, QueueSchema]) -> Iterator[str]:
    """The emulator's DDL with each queue's table shown as the queue (as declared when the
    front saw the declaration, else rebuilt from the table)."""
    for statement in statements:
        queue = queue_from_table_ddl(statement)
        if queue is None:
            yield statement
            continue
        seen = known.get(queue.name.upper())
        if seen is not None and seen.declared:
            yield seen.declared
        else:
            text = queue_ddl_from_table(statement)
            if seen is not None and seen.options:
                text += f", {seen.options}"
            yield text

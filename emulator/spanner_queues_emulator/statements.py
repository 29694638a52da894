"""Recognise the queue statements in SQL sent to the front.

Only three shapes need the front; everything else goes to the emulator untouched:

- ``SELECT <columns | *> FROM RECEIVE_<Q>(args)`` (PostgreSQL: ``spanner.receive_<q>(...)``);
- ``SELECT <columns | *> FROM RENEWLEASE_<Q>(lease_tokens => [...])``
  (PostgreSQL: ``spanner.renewlease_<q>(lease_tokens => ARRAY[...])``);
- ``UPDATE <queue> ...``, which Spanner refuses on queues, and ``INSERT OR UPDATE`` /
  ``INSERT OR IGNORE`` into a queue, which the front refuses too (``queue_write``);
- DML on a queue in forms Google never shows for queues, which the front refuses
  (``undocumented_queue_dml``): ``THEN RETURN``, ``INSERT ... SELECT`` (Google inserts
  ``VALUES``), and a ``DELETE`` whose ``WHERE`` names no key column (``WHERE true``: Google
  deletes a message by its key, ``DELETE FROM Q WHERE <key> = ... [ASSERT_ROWS_MODIFIED 1]``).

Arguments may be literals or query parameters (``@name``; ``$n`` binds ``pn``), named
(``max_batch_size => 10``) or positional (``max_batch_size, priority, max_duration``). A queue
function may be quoted as a whole (```RECEIVE_my-q`(...)``). Only code counts: a function
named inside a string literal or a comment is not a call (``mentioned_function``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spanner_queues_emulator.schema import code_only, split_top_level, strip_comments, unquote

_NAME = r"`[^`]+`|[A-Za-z_]\w*"
#: a queue function: ``RECEIVE_Q``, ```RECEIVE_my-q```, ``spanner.receive_q``.
_FN = r"(?:spanner\s*\.\s*)?(?:`(?:RECEIVE|RENEWLEASE)_[^`]+`|(?:RECEIVE|RENEWLEASE)_\w+)"
_CALL = re.compile(
    rf"^\s*SELECT\s+(?P<cols>.+?)\s+FROM\s+(?P<fn>{_FN})"
    rf"\s*\((?P<args>.*)\)\s*(?:(?:AS\s+)?(?P<alias>{_NAME}))?\s*;?\s*$",
    re.I | re.S,
)
_MENTION = re.compile(
    r"(?:\bspanner\s*\.\s*)?(?:`(RECEIVE|RENEWLEASE)_([^`]+)`|\b(RECEIVE|RENEWLEASE)_(\w+))\s*\(",
    re.I,
)
#: an optional statement hint, ``@{...}``, before DML.
_HINT = r"(?:@\s*\{[^}]*\}\s*)?"
_UPDATE = re.compile(rf"^\s*{_HINT}UPDATE\s+(?P<name>{_NAME})(?![\w`])", re.I)
_UPSERT = re.compile(
    rf"^\s*{_HINT}INSERT\s+OR\s+(?P<how>UPDATE|IGNORE)\s+(?:INTO\s+)?(?P<name>{_NAME})(?![\w`])",
    re.I,
)
_INSERT = re.compile(
    rf"^\s*{_HINT}INSERT\s+(?:INTO\s+)?(?P<name>{_NAME})(?![\w`])(?P<rest>.*)$", re.I | re.S
)
_DELETE = re.compile(
    rf"^\s*{_HINT}DELETE\s+(?:FROM\s+)?(?P<name>{_NAME})(?![\w`])(?P<rest>.*)$", re.I | re.S
)
_THEN_RETURN = re.compile(r"\bTHEN\s+RETURN\b", re.I)
_WHERE = re.compile(r"\bWHERE\b(?P<cond>.*?)(?:\bASSERT_ROWS_MODIFIED\b.*)?$", re.I | re.S)
RECEIVE_ARGS = ("max_batch_size", "priority", "max_duration")
#: the PostgreSQL spelling (``spanner.receive_q``) of the queue functions' own columns.
PG_COLUMNS = {
    "payload": "Payload",
    "deliver_time": "DeliverTime",
    "spanner_lease_token": "SpannerLeaseToken",
    "spanner_lease_expiration_timestamp": "SpannerLeaseExpirationTimestamp",
    "spanner_last_batch_message": "SpannerLastBatchMessage",
    "spanner_old_lease_token": "SpannerOldLeaseToken",
    "spanner_new_lease_token": "SpannerNewLeaseToken",
}
#: Spanner refuses a statement with more query parameters than this, whatever it calls (a
#: RENEWLEASE array literal of parameters included); the emulator checks the statements it
#: runs, the front the ones it answers itself.
MAX_PARAMETERS = 950


class StatementError(ValueError):
    """A queue statement the front cannot run; the text says why (INVALID_ARGUMENT)."""


@dataclass(frozen=True, slots=True)
class QueueCall:
    """``SELECT cols FROM RECEIVE_<Q>(...)`` or ``RENEWLEASE_<Q>(...)``."""

    kind: str  # "RECEIVE" | "RENEWLEASE"
    queue: str
    columns: tuple[str, ...] | None  # None: *
    args: dict[str, Any]  # RECEIVE: name -> python value; RENEWLEASE: {"lease_tokens": [...]}


def check_parameter_count(count: int) -> None:
    """Refuse, in Spanner's words, a statement binding more than ``MAX_PARAMETERS``."""
    if count > MAX_PARAMETERS:
        raise StatementError(
            f"Number of parameters in query exceeds the maximum allowed limit of {MAX_PARAMETERS}."
        )


def mentioned_function(sql: str) -> tuple[str, str] | None:
    """(``RECEIVE``/``RENEWLEASE``, queue) of the first queue function ``sql`` calls; string
    literals and comments are not looked at."""
    m = _MENTION.search(code_only(sql))
    if not m:
        return None
    kind, queue = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    return kind.upper(), queue


def updated_table(sql: str) -> str | None:
    """The table an ``UPDATE`` statement updates, None for any other statement."""
    m = _UPDATE.match(strip_comments(sql))
    return unquote(m.group("name")) if m else None


def queue_write(sql: str) -> tuple[str, str] | None:
    """(``UPDATE`` / ``INSERT OR UPDATE`` / ``INSERT OR IGNORE``, table) of a DML statement
    that would change or skip an existing row; None for any other statement (``INSERT``,
    ``DELETE``, queries)."""
    text = strip_comments(sql)
    m = _UPDATE.match(text)
    if m:
        return "UPDATE", unquote(m.group("name"))
    m = _UPSERT.match(text)
    if m:
        return f"INSERT OR {m.group('how').upper()}", unquote(m.group("name"))
    return None


def inserted_table(sql: str) -> str | None:
    """The table an ``INSERT`` statement (not ``INSERT OR ...``) writes, None for any other
    statement."""
    text = code_only(sql)
    if _UPSERT.match(text):
        return None
    m = _INSERT.match(text)
    return unquote(m.group("name")) if m else None


def dml_table(sql: str) -> str | None:
    """The table an ``INSERT`` or ``DELETE`` statement writes, None for any other statement."""
    text = code_only(sql)
    m = _INSERT.match(text) or _DELETE.match(text)
    return unquote(m.group("name")) if m else None


def undocumented_queue_dml(sql: str, keys: Sequence[str]) -> str | None:
    """Why ``sql``, DML on a queue whose key columns are ``keys``, is in a form Google never
    shows for queues (the front refuses it), or None: ``THEN RETURN``; ``INSERT ... SELECT``
    (Google's inserts list ``VALUES``); a ``DELETE`` whose ``WHERE`` names no key column
    (Google deletes messages by key). String literals and comments are not looked at."""
    text = code_only(sql)
    if _THEN_RETURN.search(text):
        return "THEN RETURN"
    m = _INSERT.match(text)
    if m:
        rest = re.sub(r"^\s*\([^()]*\)", "", m.group("rest"))  # the column list
        if not re.match(r"\s*VALUES\b", rest, re.I):
            return "INSERT ... SELECT (insert VALUES)"
        return None
    m = _DELETE.match(text)
    if m:
        where = _WHERE.search(m.group("rest"))
        names = {k.upper() for k in keys}
        words = (
            {w.strip("`").upper() for w in re.findall(r"`[^`]+`|\w+", where.group("cond"))}
            if where
            else set()
        )
        if not names & words:
            return "DELETE without a filter on the key (delete messages by key)"
    return None


def parse_call(sql: str, params: dict[str, Any]) -> QueueCall:
    """Parse a RECEIVE/RENEWLEASE call; ``params`` are the request's parameters as Python
    values (strings, ints, lists, None)."""
    text = strip_comments(sql)
    m = _CALL.match(text)
    if not m:
        raise StatementError(
            "the emulator front runs queue functions only as "
            "'SELECT <columns or *> FROM RECEIVE_<Queue>(...)' / 'RENEWLEASE_<Queue>(...)', "
            "without joins, filters or subqueries"
        )
    fn = re.sub(r"\s+", "", m.group("fn")).replace("`", "")
    kind, _, queue = fn.split(".")[-1].partition("_")
    kind = kind.upper()
    cols = m.group("cols").strip()
    columns = None if cols == "*" else tuple(_column(c) for c in split_top_level(cols))
    if columns is not None and fn.lower().startswith("spanner."):  # PostgreSQL spelling
        columns = tuple(PG_COLUMNS.get(c.lower(), c) for c in columns)
    raw = split_top_level(m.group("args"))
    if kind == "RECEIVE":
        args = _receive_args(raw, params)
    else:
        args = {"lease_tokens": _renew_tokens(raw, params)}
    return QueueCall(kind=kind, queue=queue, columns=columns, args=args)


def _column(text: str) -> str:
    m = re.match(rf"^\s*(?:{_NAME}\s*\.\s*)?({_NAME})\s*(?:AS\s+({_NAME}))?\s*$", text, re.I)
    if not m:
        raise StatementError(f"the emulator front selects plain column names, not {text!r}")
    if m.group(2):
        raise StatementError(f"the emulator front does not rename columns ({text!r})")
    return unquote(m.group(1))


def _named(arg: str) -> tuple[str | None, str]:
    m = re.match(r"^\s*(\w+)\s*=>\s*(.*)$", arg, re.S)
    return (m.group(1).lower(), m.group(2).strip()) if m else (None, arg.strip())


def _receive_args(raw: list[str], params: dict[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for position, arg in enumerate(raw):
        name, value = _named(arg)
        if name is None:
            if position >= len(RECEIVE_ARGS):
                raise StatementError("RECEIVE takes at most three arguments")
            name = RECEIVE_ARGS[position]
        if name not in RECEIVE_ARGS:
            raise StatementError(f"RECEIVE has no argument {name!r}")
        args[name] = _scalar(value, params)
    return args


def _renew_tokens(raw: list[str], params: dict[str, Any]) -> list[Any]:
    if len(raw) != 1:
        raise StatementError("RENEWLEASE takes one argument, lease_tokens")
    name, value = _named(raw[0])
    if name not in (None, "lease_tokens"):
        raise StatementError(f"RENEWLEASE has no argument {name!r}")
    m = re.match(r"^(?:ARRAY\s*(?:<\s*STRING\s*>)?\s*)?\[(.*)\]$", value, re.I | re.S)
    if m:
        return [_scalar(item, params) for item in split_top_level(m.group(1))]
    tokens = _scalar(value, params)
    if not isinstance(tokens, list):
        raise StatementError("lease_tokens must be an array of STRING")
    return tokens


def _scalar(text: str, params: dict[str, Any]) -> Any:
    text = text.strip()
    if text.upper() == "NULL":
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if text.startswith("@") or text.startswith("$"):
        name = text[1:] if text.startswith("@") else f"p{text[1:]}"
        if name not in params:
            raise StatementError(f"No parameter found for binding: {name}")
        return params[name]
    m = re.fullmatch(r"""[rR]?(['"])(.*)\1""", text, re.S)
    if m:
        return re.sub(r"\\(.)", r"\1", m.group(2)) if text[0] not in "rR" else m.group(2)
    raise StatementError(f"the emulator front cannot evaluate {text!r} here")

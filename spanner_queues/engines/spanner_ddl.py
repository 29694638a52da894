"""DDL and SQL text for native queues, in both Spanner dialects, from one declaration.

``declare(model, options)`` reads a queue model once; ``GoogleSQL`` and ``PostgreSQL`` render
it. The table-engine bookkeeping fields (``send_time``, ``attempts``, ``lease_token``,
``lease_expires_at``) and ``DeliverTime`` (Spanner creates it) are never declared.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from spanner_queues.exceptions import QueueConfigurationError
from spanner_queues.keys import key_fields, parent_model
from spanner_queues.options import row_deletion
from spanner_queues.payload import payload_type
from spanner_queues.semantics import format_duration

if TYPE_CHECKING:
    from django.db import models

    from spanner_queues.options import QueueOptions, RowDeletion

GOOGLESQL = "googlesql"
POSTGRESQL = "postgresql"

# GoogleSQL reserved keywords (lexical structure page); quoted when used as identifiers.
_GOOGLESQL_RESERVED = frozenset(
    """ALL AND ANY ARRAY AS ASC ASSERT_ROWS_MODIFIED AT BETWEEN BY CASE CAST COLLATE CONTAINS
    CREATE CROSS CUBE CURRENT DEFAULT DEFINE DESC DISTINCT ELSE END ENUM ESCAPE EXCEPT EXCLUDE
    EXISTS EXTRACT FALSE FETCH FOLLOWING FOR FROM FULL GROUP GROUPING GROUPS HASH HAVING IF
    IGNORE IN INNER INTERSECT INTERVAL INTO IS JOIN LATERAL LEFT LIKE LIMIT LOOKUP MERGE NATURAL
    NEW NO NOT NULL NULLS OF ON OR ORDER OUTER OVER PARTITION PRECEDING PROTO RANGE RECURSIVE
    RESPECT RIGHT ROLLUP ROWS SELECT SET SOME STRUCT TABLESAMPLE THEN TO TREAT TRUE UNBOUNDED
    UNION UNNEST USING WHEN WHERE WINDOW WITH WITHIN""".split()
)
_PG_RESERVED = frozenset(
    """all analyse analyze and any array as asc asymmetric both case cast check collate column
    constraint create current_catalog current_date current_role current_time current_timestamp
    current_user default deferrable desc distinct do else end except false fetch for foreign
    from grant group having in initially intersect into lateral leading limit localtime
    localtimestamp not null offset on only or order placing primary references returning
    select session_user some symmetric table then to trailing true union unique user using
    variadic when where window with""".split()
)
#: Spanner refuses a statement with more than 950 query parameters ("Number of parameters in
#: query exceeds the maximum allowed limit of 950"); a TVF's array literal is no exception.
MAX_QUERY_PARAMETERS = 950

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DURATION = re.compile(r"^\d+(ms|s|m|h)$")

#: Django internal type -> (GoogleSQL type, PostgreSQL-dialect type). ``%(n)s`` = max_length.
_TYPES: dict[str, tuple[str, str]] = {
    "AutoField": ("INT64", "bigint"),
    "BigAutoField": ("INT64", "bigint"),
    "SmallAutoField": ("INT64", "bigint"),
    "IntegerField": ("INT64", "bigint"),
    "BigIntegerField": ("INT64", "bigint"),
    "SmallIntegerField": ("INT64", "bigint"),
    "PositiveIntegerField": ("INT64", "bigint"),
    "PositiveBigIntegerField": ("INT64", "bigint"),
    "PositiveSmallIntegerField": ("INT64", "bigint"),
    "CharField": ("STRING(%(n)s)", "varchar(%(n)s)"),
    "SlugField": ("STRING(%(n)s)", "varchar(%(n)s)"),
    "EmailField": ("STRING(%(n)s)", "varchar(%(n)s)"),
    "TextField": ("STRING(MAX)", "text"),
    "UUIDField": ("STRING(32)", "varchar(32)"),
    "BinaryField": ("BYTES(MAX)", "bytea"),
    "BooleanField": ("BOOL", "boolean"),
    "DateField": ("DATE", "date"),
    "DateTimeField": ("TIMESTAMP", "timestamptz"),
    "FloatField": ("FLOAT64", "float8"),
    "DecimalField": ("NUMERIC", "numeric"),
}


@dataclass(frozen=True, slots=True)
class KeyColumn:
    column: str
    internal_type: str
    max_length: int | None = None


@dataclass(frozen=True, slots=True)
class QueueDeclaration:
    """What a queue model says about its native queue, dialect-free."""

    name: str
    keys: tuple[KeyColumn, ...]
    parent: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    row_deletion: RowDeletion | None = None
    #: "bytes", "string" or "json" (``spanner_queues.payload``).
    payload_type: str = "bytes"


def _key_column(f: Any) -> KeyColumn:
    target = f.target_field if getattr(f, "remote_field", None) and f.is_relation else f
    internal = target.get_internal_type()
    if internal not in _TYPES:
        raise QueueConfigurationError(
            f"Key field {f.name!r} ({internal}) has no native-queue column type; use an "
            "integer, string, bytes, bool, date, timestamp, float or decimal field."
        )
    return KeyColumn(f.column, internal, getattr(target, "max_length", None))


def declare(model: type[models.Model], options: QueueOptions) -> QueueDeclaration:
    """Read a queue model's key columns, interleave parent, ``native_options`` and
    ``row_deletion_policy``."""

    parent = None
    if options.interleave_in_parent:
        parent = parent_model(model, options.interleave_in_parent)._meta.db_table
    return QueueDeclaration(
        name=model._meta.db_table,
        keys=tuple(_key_column(f) for f in key_fields(model)),
        parent=parent,
        options=dict(options.native_options or {}),
        row_deletion=row_deletion(model, options),
        payload_type=payload_type(model),
    )


def duration(seconds: float) -> str:
    """``max_duration`` text (``spanner_queues.semantics.format_duration``): whole minutes as
    ``'20m'``, else seconds or milliseconds."""
    try:
        return format_duration(seconds)
    except ValueError:
        raise QueueConfigurationError("RECEIVE max_duration must be positive.") from None


class Dialect:
    """SQL spelling of one Spanner dialect. Placeholders are rendered by ``placeholder``."""

    name: ClassVar[str]
    payload_column: ClassVar[str]
    deliver_time_column: ClassVar[str]
    lease_token: ClassVar[str]
    lease_expires: ClassVar[str]
    last_batch_message: ClassVar[str]
    old_token: ClassVar[str]
    new_token: ClassVar[str]
    now: ClassVar[str]
    #: payload type -> column type of ``Payload``.
    payload_types: ClassVar[dict[str, str]]

    def payload_value(self, decl: QueueDeclaration, placeholder: str) -> str:
        """The SQL that writes a bound payload: JSON text goes as a STRING and is parsed
        (a JSON column takes no STRING value); bytes and strings go as they are."""
        return placeholder

    def __init__(self, *, paramstyle: str = "native") -> None:
        #: "native" (@p / $n, what goes on the wire) or "format" (%s, for a Django cursor).
        self.paramstyle = paramstyle

    # --- names -------------------------------------------------------------------------
    def quote(self, name: str) -> str:
        raise NotImplementedError

    def placeholder(self, index: int, name: str) -> str:
        raise NotImplementedError

    def column_type(self, key: KeyColumn) -> str:
        google, pg = _TYPES[key.internal_type]
        template = google if self.name == GOOGLESQL else pg
        if "%(n)s" in template:
            if key.max_length:
                return template % {"n": key.max_length}
            return "STRING(MAX)" if self.name == GOOGLESQL else "text"
        return template

    def receive_function(self, queue: str) -> str:
        raise NotImplementedError

    def renew_function(self, queue: str) -> str:
        raise NotImplementedError

    # --- DDL ---------------------------------------------------------------------------
    def create_queue(self, decl: QueueDeclaration) -> str:
        raise NotImplementedError

    def drop_queue(self, decl: QueueDeclaration) -> str:
        return f"DROP QUEUE {self.quote(decl.name)}"

    # --- DML and queries -----------------------------------------------------------------
    def insert_width(self, decl: QueueDeclaration, *, with_deliver_time: bool) -> int:
        """Parameters one message takes in ``insert``."""
        return len(decl.keys) + 1 + int(with_deliver_time)

    def insert(self, decl: QueueDeclaration, rows: int, *, with_deliver_time: bool) -> str:
        """``INSERT`` of ``rows`` messages; bind at most ``MAX_QUERY_PARAMETERS`` in one
        statement (``insert_width`` each)."""
        columns = [self.quote(k.column) for k in decl.keys] + [self.payload_column]
        if with_deliver_time:
            columns.append(self.deliver_time_column)
        width = len(columns)
        payload_at = len(decl.keys)

        def value(index: int) -> str:
            placeholder = self.placeholder(index, self.param_name(index))
            return (
                self.payload_value(decl, placeholder)
                if index % width == payload_at
                else placeholder
            )

        values = ", ".join(
            "(" + ", ".join(value(r * width + c) for c in range(width)) + ")" for r in range(rows)
        )
        return f"INSERT INTO {self.quote(decl.name)} ({', '.join(columns)}) VALUES {values}"

    def ack(self, decl: QueueDeclaration) -> str:
        where = " AND ".join(
            f"{self.quote(k.column)} = {self.placeholder(i, f'k{i}')}"
            for i, k in enumerate(decl.keys)
        )
        return f"DELETE FROM {self.quote(decl.name)} WHERE {where} ASSERT_ROWS_MODIFIED 1"

    def ack_many(self, decl: QueueDeclaration, count: int) -> str:
        """Ack ``count`` messages in one statement: ``DELETE ... WHERE <key> IN (...)
        ASSERT_ROWS_MODIFIED count``, which fails with ``OUT_OF_RANGE`` (and deletes nothing)
        unless every key finds its message; ``ack`` when ``count`` is 1. Key values are bound
        in key-column order, message after message (at most ``MAX_QUERY_PARAMETERS``)."""
        if count < 1:
            raise QueueConfigurationError("An ack needs at least one key.")
        if count == 1:
            return self.ack(decl)
        return f"{self.delete_keys(decl, count)} ASSERT_ROWS_MODIFIED {count}"

    def delete_keys(self, decl: QueueDeclaration, count: int) -> str:
        """``DELETE ... WHERE <key> IN (...)`` of ``count`` messages, missing ones skipped
        (Google's plain delete by key, without the assertion); key values bound as in
        ``ack_many``."""
        width = len(decl.keys)
        if count * width > MAX_QUERY_PARAMETERS:
            raise QueueConfigurationError(
                f"A delete statement binds at most {MAX_QUERY_PARAMETERS} key values."
            )
        return f"DELETE FROM {self.quote(decl.name)} WHERE {self._keys_in(decl, count)}"

    def select_keys(self, decl: QueueDeclaration, count: int) -> str:
        """``SELECT <key> FROM ... WHERE <key> IN (...)``: which of ``count`` messages are in
        the queue; key values bound as in ``ack_many``."""
        columns = ", ".join(self.quote(k.column) for k in decl.keys)
        return f"SELECT {columns} FROM {self.quote(decl.name)} WHERE {self._keys_in(decl, count)}"

    def _keys_in(self, decl: QueueDeclaration, count: int) -> str:
        width = len(decl.keys)
        if count * width > MAX_QUERY_PARAMETERS:
            raise QueueConfigurationError(
                f"A statement by key binds at most {MAX_QUERY_PARAMETERS} key values."
            )

        def row(r: int) -> str:
            values = [self.placeholder(r * width + c, f"k{r * width + c}") for c in range(width)]
            return values[0] if width == 1 else f"({', '.join(values)})"

        columns = [self.quote(k.column) for k in decl.keys]
        target = columns[0] if width == 1 else f"({', '.join(columns)})"
        return f"{target} IN ({', '.join(row(r) for r in range(count))})"

    def receive(
        self, decl: QueueDeclaration, *, max_batch_size: int | None, max_duration: str | None
    ) -> str:
        columns = [self.quote(k.column) for k in decl.keys] + [
            self.payload_column,
            self.deliver_time_column,
            self.lease_token,
            self.lease_expires,
            self.last_batch_message,
        ]
        return (
            f"SELECT {', '.join(columns)} FROM {self.receive_function(decl.name)}"
            f"({self._receive_args(max_batch_size, max_duration)})"
        )

    #: whether RECEIVE names all three arguments, NULL for defaults (Google's PostgreSQL
    #: examples always do); GoogleSQL leaves out the ones not set.
    receive_names_every_argument: ClassVar[bool] = False

    def _receive_args(self, max_batch_size: int | None, max_duration: str | None) -> str:
        args = {"max_batch_size": "NULL", "priority": "NULL", "max_duration": "NULL"}
        if max_batch_size is not None:
            if not isinstance(max_batch_size, int) or max_batch_size < 1:
                raise QueueConfigurationError("RECEIVE max_batch_size must be an int >= 1.")
            args["max_batch_size"] = str(max_batch_size)
        if max_duration is not None:
            if not _DURATION.match(max_duration):
                raise QueueConfigurationError(
                    f"RECEIVE max_duration {max_duration!r} is not like '20m', '90s', '500ms'."
                )
            args["max_duration"] = f"'{max_duration}'"
        return ", ".join(
            f"{name} => {value}"
            for name, value in args.items()
            if self.receive_names_every_argument or value != "NULL"
        )

    def param_name(self, index: int) -> str:
        """The name of the query parameter that ``placeholder(index, ...)`` binds."""
        return f"p{index}"

    def array_literal(self, items: Sequence[str]) -> str:
        raise NotImplementedError

    def renew(self, decl: QueueDeclaration, count: int) -> str:
        """``RENEWLEASE_<Q>`` for ``count`` tokens, spelled as Google documents it: an array
        literal of one STRING parameter per token (bind them with ``renew_params``); at most
        ``MAX_QUERY_PARAMETERS`` tokens in one call."""
        if count < 1:
            raise QueueConfigurationError("RENEWLEASE needs at least one lease token.")
        if count > MAX_QUERY_PARAMETERS:
            raise QueueConfigurationError(
                f"RENEWLEASE binds one parameter per token: at most {MAX_QUERY_PARAMETERS} "
                "tokens in one call (renew in chunks)."
            )
        tokens = self.array_literal([self.placeholder(i, self.param_name(i)) for i in range(count)])
        return (
            f"SELECT {self.old_token}, {self.new_token}, {self.lease_expires} "
            f"FROM {self.renew_function(decl.name)}(lease_tokens => {tokens})"
        )

    def renew_params(self, tokens: Sequence[str]) -> dict[str, str]:
        """The parameters of ``renew(decl, len(tokens))``: parameter name -> token."""
        return {self.param_name(i): token for i, token in enumerate(tokens)}

    def stats(self, decl: QueueDeclaration) -> str:
        dt = self.deliver_time_column
        return (
            f"SELECT COUNT(*), SUM(CASE WHEN {dt} <= {self.now} THEN 1 ELSE 0 END), "
            f"MIN({dt}) FROM {self.quote(decl.name)}"
        )

    def keys(self, decl: QueueDeclaration) -> str:
        """The keys of every message of the queue (``purge`` deletes them by key)."""
        columns = ", ".join(self.quote(k.column) for k in decl.keys)
        return f"SELECT {columns} FROM {self.quote(decl.name)}"


def _option_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise QueueConfigurationError(f"native_options value {value!r} is not str, bool, int or None.")


class GoogleSQL(Dialect):
    name = GOOGLESQL
    payload_column = "Payload"
    deliver_time_column = "DeliverTime"
    lease_token = "SpannerLeaseToken"
    lease_expires = "SpannerLeaseExpirationTimestamp"
    last_batch_message = "SpannerLastBatchMessage"
    old_token = "SpannerOldLeaseToken"
    new_token = "SpannerNewLeaseToken"
    now = "CURRENT_TIMESTAMP()"
    payload_types = {"bytes": "BYTES(MAX)", "string": "STRING(MAX)", "json": "JSON"}

    def payload_value(self, decl: QueueDeclaration, placeholder: str) -> str:
        return (
            f"PARSE_JSON({placeholder}, wide_number_mode=>'round')"
            if decl.payload_type == "json"
            else placeholder
        )

    def quote(self, name: str) -> str:
        if _PLAIN.match(name) and name.upper() not in _GOOGLESQL_RESERVED:
            return name
        return "`" + name.replace("`", "\\`") + "`"

    def placeholder(self, index: int, name: str) -> str:
        return "%s" if self.paramstyle == "format" else f"@{name}"

    def array_literal(self, items: Sequence[str]) -> str:
        return f"[{', '.join(items)}]"

    def receive_function(self, queue: str) -> str:
        return f"RECEIVE_{queue}"

    def renew_function(self, queue: str) -> str:
        return f"RENEWLEASE_{queue}"

    def create_queue(self, decl: QueueDeclaration) -> str:
        lines = [f"  {self.quote(k.column)} {self.column_type(k)} NOT NULL" for k in decl.keys]
        lines.append(f"  {self.payload_column} {self.payload_types[decl.payload_type]} NOT NULL")
        keys = ", ".join(self.quote(k.column) for k in decl.keys)
        sql = f"CREATE QUEUE {self.quote(decl.name)} (\n" + ",\n".join(lines) + "\n)"
        sql += f" PRIMARY KEY ({keys})"
        if decl.parent:
            sql += f", INTERLEAVE IN PARENT {self.quote(decl.parent)} ON DELETE CASCADE"
        if decl.row_deletion is not None:
            column = decl.row_deletion.column or self.deliver_time_column
            sql += (
                f", ROW DELETION POLICY (OLDER_THAN({self.quote(column)}, "
                f"INTERVAL {int(decl.row_deletion.days)} DAY))"
            )
        if decl.options:
            opts = ", ".join(f"{k} = {_option_value(v)}" for k, v in decl.options.items())
            sql += f", OPTIONS ({opts})"
        return sql


class PostgreSQL(Dialect):
    name = POSTGRESQL
    payload_column = "payload"
    deliver_time_column = "deliver_time"
    lease_token = "spanner_lease_token"
    lease_expires = "spanner_lease_expiration_timestamp"
    last_batch_message = "spanner_last_batch_message"
    old_token = "spanner_old_lease_token"
    new_token = "spanner_new_lease_token"
    now = "CURRENT_TIMESTAMP"
    payload_types = {"bytes": "bytea", "string": "text", "json": "jsonb"}
    receive_names_every_argument = True

    def payload_value(self, decl: QueueDeclaration, placeholder: str) -> str:
        return f"CAST({placeholder} AS jsonb)" if decl.payload_type == "json" else placeholder

    def quote(self, name: str) -> str:
        if re.match(r"^[a-z_][a-z0-9_]*$", name) and name not in _PG_RESERVED:
            return name
        return '"' + name.replace('"', '""') + '"'

    def placeholder(self, index: int, name: str) -> str:
        return "%s" if self.paramstyle == "format" else f"${index + 1}"

    def param_name(self, index: int) -> str:
        return f"p{index + 1}"  # $1 binds the parameter named p1

    def array_literal(self, items: Sequence[str]) -> str:
        return f"ARRAY[{', '.join(items)}]"

    def _function_suffix(self, queue: str) -> str:
        if not re.match(r"^[a-z_][a-z0-9_]*$", queue):
            raise QueueConfigurationError(
                f"PostgreSQL-dialect queue name {queue!r} must be lower case "
                "(spanner.receive_<queue> is spelled from it)."
            )
        return queue

    def receive_function(self, queue: str) -> str:
        return f"spanner.receive_{self._function_suffix(queue)}"

    def renew_function(self, queue: str) -> str:
        return f"spanner.renewlease_{self._function_suffix(queue)}"

    def create_queue(self, decl: QueueDeclaration) -> str:
        if decl.options:
            raise QueueConfigurationError(
                f"{decl.name}: native_options are not rendered for the PostgreSQL dialect "
                "(Google documents no PostgreSQL spelling of queue OPTIONS); remove them or "
                "apply them with ALTER QUEUE by hand."
            )
        lines = [f"  {self.quote(k.column)} {self.column_type(k)} NOT NULL" for k in decl.keys]
        lines.append(f"  {self.payload_column} {self.payload_types[decl.payload_type]} NOT NULL")
        keys = ", ".join(self.quote(k.column) for k in decl.keys)
        lines.append(f"  PRIMARY KEY ({keys})")
        sql = f"CREATE QUEUE {self.quote(decl.name)} (\n" + ",\n".join(lines) + "\n)"
        if decl.parent:
            sql += f" INTERLEAVE IN PARENT {self.quote(decl.parent)} ON DELETE CASCADE"
        if decl.row_deletion is not None:  # the TTL clause of PostgreSQL-dialect tables
            column = decl.row_deletion.column or self.deliver_time_column
            sql += f" TTL INTERVAL '{int(decl.row_deletion.days)} days' ON {self.quote(column)}"
        return sql


DIALECTS: dict[str, type[Dialect]] = {GOOGLESQL: GoogleSQL, POSTGRESQL: PostgreSQL}


def dialect(name: str, *, paramstyle: str = "native") -> Dialect:
    """The dialect called ``name`` (``"googlesql"`` or ``"postgresql"``)."""
    try:
        return DIALECTS[str(name).lower()](paramstyle=paramstyle)
    except KeyError:
        raise QueueConfigurationError(
            f"Unknown Spanner dialect {name!r}; use 'googlesql' or 'postgresql'."
        ) from None

"""An in-process fake of the Cloud Spanner gRPC API, with queues, for wire-level tests.

It records every request, runs ordinary SQL and DDL on SQLite (enough for the Django ORM on
simple models), and implements what the emulator cannot: ``CREATE QUEUE``/``DROP QUEUE``,
``RECEIVE_<Q>`` (a long-running stream on a strong single-use snapshot only), ``RENEWLEASE_<Q>``
(rotating tokens; no row for unknown or expired tokens, a NULL new token for an acked message),
``DELETE ... ASSERT_ROWS_MODIFIED n`` (``OUT_OF_RANGE``), and the ``Send``/``Ack`` mutations
(``NOT_FOUND`` unless ``ignore_not_found``). Tests can also script RECEIVE/RENEWLEASE result sets
and inject errors (``OUT_OF_RANGE``, ``NOT_FOUND``, ``ABORTED``, ``UNAVAILABLE``...).

google-cloud-spanner's own ``testing/mock_spanner.py`` plays back fixed results by SQL text only;
it keeps no state, so sending, receiving and acking a message cannot be followed through it.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import secrets
import sqlite3
import tempfile
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import grpc
from google.cloud.spanner_admin_database_v1.types import spanner_database_admin as admin
from google.cloud.spanner_v1 import TypeCode
from google.cloud.spanner_v1.testing import spanner_database_admin_pb2_grpc as admin_grpc
from google.cloud.spanner_v1.testing import spanner_pb2_grpc as spanner_grpc
from google.cloud.spanner_v1.types import (
    commit_response,
    result_set,
    spanner,
    transaction,
)
from google.cloud.spanner_v1.types import (
    type as spanner_type,
)
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2, struct_pb2

UTC = timezone.utc
_TYPE_CODES = {
    "INT64": TypeCode.INT64,
    "STRING": TypeCode.STRING,
    "BYTES": TypeCode.BYTES,
    "BOOL": TypeCode.BOOL,
    "TIMESTAMP": TypeCode.TIMESTAMP,
    "FLOAT64": TypeCode.FLOAT64,
    "DATE": TypeCode.DATE,
    "NUMERIC": TypeCode.NUMERIC,
    "JSON": TypeCode.JSON,
}


def ts(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_ts() -> str:
    return ts(datetime.now(UTC))


def parse_ts(text: str) -> datetime:
    text = text.rstrip("Z")
    main, _, frac = text.partition(".")
    return datetime.strptime(main, "%Y-%m-%dT%H:%M:%S").replace(
        microsecond=int((frac + "000000")[:6]), tzinfo=UTC
    )


class FakeError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Table:
    name: str
    columns: dict[str, str]  # lower name -> Spanner type (INT64, STRING...)
    names: dict[str, str]  # lower name -> declared name
    pk: list[str]
    is_queue: bool = False


@dataclass
class Lease:
    queue: str
    key: tuple[Any, ...]
    expires: datetime
    message: str  # the row's hidden incarnation id: a re-sent key is a new message


@dataclass
class FakeDatabase:
    name: str
    path: Path
    tables: dict[str, Table] = field(default_factory=dict)
    ddl: list[str] = field(default_factory=list)
    leases: dict[str, Lease] = field(default_factory=dict)  # token -> lease
    lock: threading.RLock = field(default_factory=threading.RLock)

    def connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=2)
        conn.execute("PRAGMA foreign_keys=ON")
        conn.create_function("fake_now", 0, now_ts)
        return conn

    def live_lease(self, queue: str, message: str) -> str | None:
        now = datetime.now(UTC)
        for token, lease in self.leases.items():
            if lease.queue == queue and lease.message == message and lease.expires > now:
                return token
        return None


@dataclass
class Txn:
    db: FakeDatabase
    conn: sqlite3.Connection | None
    read_only: bool


@dataclass
class Injected:
    method: str
    code: grpc.StatusCode
    message: str
    sql_contains: str | None
    times: int
    #: answer with ``code`` after the call has run (its effects applied): a lost answer.
    after: bool = False


@dataclass
class Recorded:
    method: str
    request: Any

    @property
    def sql(self) -> str | None:
        return getattr(self.request, "sql", None)


class FakeSpanner:
    """State shared by the two servicers; start with ``FakeSpanner.start()``."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="fake-spanner-"))
        self.databases: dict[str, FakeDatabase] = {}
        self.requests: list[Recorded] = []
        self.injected: list[Injected] = []
        self.scripted: list[tuple[str, list[list[Any]] | None, FakeError | None]] = []
        self.txns: dict[bytes, Txn] = {}
        #: transaction id -> its CommitResponse: a retried Commit of a committed transaction
        #: gets the same answer (Spanner: a commit with a transaction id is safe to retry).
        self.committed: dict[bytes, Any] = {}
        self.lease_seconds = 10.0
        #: TABLE_TYPE that information_schema.tables gives queues (Spanner's value is unknown).
        self.queue_table_type = "QUEUE"
        self.streams_end = threading.Event()
        #: how each computed RECEIVE call ended: "ended" (its max_duration) or "cancelled".
        self.receive_ends: list[str] = []
        #: whether RECEIVE batches carry resume tokens (Spanner's behaviour is undocumented).
        self.resume_tokens = True
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self.server: grpc.Server | None = None
        self.port = 0

    # --- lifecycle and test helpers ------------------------------------------------------
    def start(self) -> FakeSpanner:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=128))
        spanner_grpc.add_SpannerServicer_to_server(SpannerServicer(self), self.server)
        admin_grpc.add_DatabaseAdminServicer_to_server(AdminServicer(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        return self

    def stop(self) -> None:
        self.streams_end.set()
        if self.server is not None:
            self.server.stop(0)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()
            self.receive_ends.clear()
            self.injected.clear()
            self.scripted.clear()
            self.committed.clear()

    def end_streams(self) -> None:
        """End every open RECEIVE stream now (as when max_duration elapses)."""
        self.streams_end.set()
        time.sleep(0.1)
        self.streams_end.clear()

    def fail(
        self,
        method: str,
        code: grpc.StatusCode,
        message: str = "injected",
        *,
        sql_contains: str | None = None,
        times: int = 1,
        after: bool = False,
    ) -> None:
        """Answer the next ``times`` calls of ``method`` (matching ``sql_contains``) with
        ``code``; with ``after``, once the call has run and applied its effects (a commit
        that is applied while its answer is lost)."""
        with self._lock:
            self.injected.append(Injected(method, code, message, sql_contains, times, after))

    def script(
        self,
        sql_contains: str,
        rows: list[list[Any]] | None = None,
        *,
        error: tuple[grpc.StatusCode, str] | None = None,
    ) -> None:
        """Play back ``rows`` (wire values) or ``error`` for the next query containing
        ``sql_contains`` instead of computing the result."""
        with self._lock:
            self.scripted.append(
                (sql_contains, rows, FakeError(*error) if error is not None else None)
            )

    def sql(self, contains: str = "") -> list[Recorded]:
        return [r for r in list(self.requests) if r.sql is not None and contains in r.sql]

    def commits(self) -> list[Any]:
        return [r.request for r in list(self.requests) if r.method == "Commit"]

    def database(self, name: str) -> FakeDatabase:
        short = name.rsplit("/", 1)[-1]
        try:
            return self.databases[short]
        except KeyError:
            raise FakeError(grpc.StatusCode.NOT_FOUND, f"Database not found: {name}") from None

    # --- plumbing ------------------------------------------------------------------------
    def record(self, method: str, request: Any, context: Any) -> Injected | None:
        """Record the call; abort it now if a fault is injected for it, or return the fault
        to answer with once it has run (``after``)."""
        with self._lock:
            self.requests.append(Recorded(method, request))
            sql = getattr(request, "sql", None)
            for item in self.injected:
                if item.method == method and (
                    item.sql_contains is None or (sql and item.sql_contains in sql)
                ):
                    item.times -= 1
                    if item.times <= 0:
                        self.injected.remove(item)
                    if item.after:
                        return item
                    if method == "Commit" and request.transaction_id:
                        self.finish(request.transaction_id, commit=False)  # Spanner drops it
                    context.abort(item.code, item.message)
        return None

    def take_script(self, sql: str) -> tuple[list[list[Any]] | None, FakeError | None] | None:
        with self._lock:
            for item in self.scripted:
                if item[0] in sql:
                    self.scripted.remove(item)
                    return item[1], item[2]
        return None

    def new_txn(self, db: FakeDatabase, options: Any) -> bytes:
        read_only = "read_only" in options or "read_write" not in options
        conn = None
        if not read_only:
            conn = db.connect()
            conn.execute("BEGIN")
        txn_id = f"txn-{next(self._ids)}".encode()
        self.txns[txn_id] = Txn(db, conn, read_only)
        return txn_id

    def txn(self, txn_id: bytes) -> Txn:
        try:
            return self.txns[txn_id]
        except KeyError:
            raise FakeError(grpc.StatusCode.NOT_FOUND, "Transaction not found") from None

    def finish(self, txn_id: bytes, *, commit: bool) -> None:
        txn = self.txns.pop(txn_id, None)
        if txn is None or txn.conn is None:
            return
        try:
            txn.conn.execute("COMMIT" if commit else "ROLLBACK")
        finally:
            txn.conn.close()


def db_of_session(session: str) -> str:
    return session.split("/sessions/")[0]


# --- values ------------------------------------------------------------------------------
def to_sqlite(value: Any, code: Any) -> Any:
    if value is None:
        return None
    if code == TypeCode.INT64:
        return int(value)
    if code == TypeCode.BYTES:
        return base64.b64decode(value)
    if code == TypeCode.TIMESTAMP:
        return ts(parse_ts(value))
    if code == TypeCode.BOOL:
        return int(bool(value))
    if code == TypeCode.FLOAT64:
        return float(value)
    return value


def to_wire(value: Any, type_name: str | None) -> Any:
    if value is None:
        return None
    if type_name == "BOOL":
        return bool(value)
    if type_name == "FLOAT64":
        return float(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if type_name == "BYTES":
        return base64.b64encode(str(value).encode()).decode()
    return str(value)


def pbv(value: Any) -> struct_pb2.Value:
    if isinstance(value, struct_pb2.Value):
        return value
    if value is None:
        return struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)
    if isinstance(value, bool):
        return struct_pb2.Value(bool_value=value)
    if isinstance(value, (int, float)):
        return struct_pb2.Value(number_value=value)
    if isinstance(value, list):
        return struct_pb2.Value(list_value=struct_pb2.ListValue(values=[pbv(v) for v in value]))
    return struct_pb2.Value(string_value=str(value))


def partial(rows: list[list[Any]], meta: Any = None) -> Any:
    """A PartialResultSet holding whole rows."""
    out = result_set.PartialResultSet()
    if meta is not None:
        out.metadata = meta
    out.values.extend([pbv(v) for row in rows for v in row])
    return out


def infer_type(value: Any) -> str:
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, int):
        return "INT64"
    if isinstance(value, float):
        return "FLOAT64"
    if isinstance(value, bytes):
        return "BYTES"
    return "STRING"


def metadata(columns: list[tuple[str, str]], txn_id: bytes | None = None) -> Any:
    meta = result_set.ResultSetMetadata(
        row_type=spanner_type.StructType(
            fields=[
                spanner_type.StructType.Field(
                    name=name, type_=spanner_type.Type(code=_TYPE_CODES[type_name])
                )
                for name, type_name in columns
            ]
        )
    )
    if txn_id is not None:
        meta.transaction = transaction.Transaction(id=txn_id)
    return meta


def params_of(request: Any) -> dict[str, Any]:
    params = dict(request.params or {})
    types = request.param_types
    out = {}
    for name, value in params.items():
        code = types[name].code if name in types else None
        if isinstance(value, list):
            out[name] = value
        else:
            out[name] = to_sqlite(value, code)
    return out


# --- DDL -----------------------------------------------------------------------------------
_IDENT = r"`?(\w+)`?"
_CREATE = re.compile(
    r"^\s*CREATE\s+(TABLE|QUEUE)\s+" + _IDENT + r"\s*\((.*)\)\s*PRIMARY\s+KEY\s*\(([^)]*)\)(.*)$",
    re.I | re.S,
)


def split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts]


def apply_ddl(db: FakeDatabase, statement: str, queue_table_type: str) -> None:
    db.ddl.append(statement)
    sql = statement.strip()
    m = _CREATE.match(sql)
    conn = db.connect()
    try:
        if m:
            kind, name, body, pk, tail = m.groups()
            items = split_top(body)
            if not items[-1]:
                raise FakeError(grpc.StatusCode.INVALID_ARGUMENT, f"trailing comma: {sql}")
            columns, names, defs = {}, {}, []
            for item in items:
                if re.match(r"^(CONSTRAINT|FOREIGN|CHECK)\b", item, re.I):
                    continue
                col_m = re.match(r"^`?(\w+)`?\s+(\w+)(.*)$", item, re.S)
                if not col_m:
                    raise FakeError(grpc.StatusCode.INVALID_ARGUMENT, f"bad column {item!r}")
                col, type_name, rest = col_m.groups()
                columns[col.lower()] = type_name.upper()
                names[col.lower()] = col
                rest = re.sub(r"\(MAX\)|\(\d+\)", "", rest, count=1)
                affinity = "TEXT" if type_name.upper() in ("STRING", "JSON") else type_name
                defs.append(f'"{col}" {affinity}{rest}')
            pk_cols = [c.strip().strip("`").split()[0] for c in pk.split(",")]
            is_queue = kind.upper() == "QUEUE"
            if is_queue:
                if "deliver_time" in columns or "delivertime" in columns:
                    raise FakeError(grpc.StatusCode.INVALID_ARGUMENT, "DeliverTime is implicit")
                others = set(columns) - {c.lower() for c in pk_cols} - {"payload"}
                if "payload" not in columns or others:
                    raise FakeError(
                        grpc.StatusCode.INVALID_ARGUMENT, "a queue has key columns and Payload"
                    )
                defs.append('"DeliverTime" TIMESTAMP NOT NULL DEFAULT (fake_now())')
                defs.append('"_message" TEXT NOT NULL DEFAULT (lower(hex(randomblob(8))))')
                columns["delivertime"], names["delivertime"] = "TIMESTAMP", "DeliverTime"
            defs.append("PRIMARY KEY (" + ", ".join(f'"{c}"' for c in pk_cols) + ")")
            parent = re.search(r"INTERLEAVE\s+IN\s+(?:PARENT\s+)?" + _IDENT, tail, re.I)
            if parent:
                ptable = db.tables[parent.group(1).lower()]
                cols = ", ".join(f'"{c}"' for c in ptable.pk)
                cascade = "ON DELETE CASCADE" if re.search(r"CASCADE", tail, re.I) else ""
                defs.append(f'FOREIGN KEY ({cols}) REFERENCES "{ptable.name}" ({cols}) {cascade}')
            conn.execute(f'CREATE TABLE "{name}" ({", ".join(defs)})')
            db.tables[name.lower()] = Table(name, columns, names, pk_cols, is_queue)
            return
        if re.match(r"^\s*CREATE\s+QUEUE", sql, re.I):
            raise FakeError(grpc.StatusCode.INVALID_ARGUMENT, f"Error parsing DDL: {sql}")
        drop = re.match(r"^DROP\s+(TABLE|QUEUE|INDEX)\s+" + _IDENT, sql, re.I)
        if drop:
            kind, name = drop.group(1).upper(), drop.group(2)
            if kind == "INDEX":
                conn.execute(f'DROP INDEX IF EXISTS "{name}"')
                return
            table = db.tables.get(name.lower())
            if table is None or table.is_queue != (kind == "QUEUE"):
                raise FakeError(grpc.StatusCode.NOT_FOUND, f"{kind} not found: {name}")
            conn.execute(f'DROP TABLE "{name}"')
            del db.tables[name.lower()]
            return
        index = re.match(
            r"^CREATE\s+(UNIQUE\s+)?(?:NULL_FILTERED\s+)?INDEX\s+"
            + _IDENT
            + r"\s+ON\s+"
            + _IDENT
            + r"\s*\(([^)]*)\)",
            sql,
            re.I,
        )
        if index:
            unique, name, table, cols = index.groups()
            conn.execute(
                f'CREATE {unique or ""}INDEX "{name}" ON "{table}" ({cols.replace("`", "")})'
            )
            return
        add = re.match(
            r"^ALTER\s+TABLE\s+" + _IDENT + r"\s+ADD\s+COLUMN\s+" + _IDENT + r"\s+(\w+)(.*)$",
            sql,
            re.I | re.S,
        )
        if add:
            table, col, type_name, rest = add.groups()
            rest = re.sub(r"\(MAX\)|\(\d+\)", "", rest, count=1).replace("NOT NULL", "")
            conn.execute(f'ALTER TABLE "{table}" ADD COLUMN "{col}" {type_name}{rest}')
            db.tables[table.lower()].columns[col.lower()] = type_name.upper()
            db.tables[table.lower()].names[col.lower()] = col
            return
        # ALTER ... (constraints, column changes): recorded, not modelled.
    except sqlite3.Error as exc:
        raise FakeError(grpc.StatusCode.INVALID_ARGUMENT, f"{exc}: {sql}") from exc
    finally:
        conn.close()


# --- queries -------------------------------------------------------------------------------
_RECEIVE = re.compile(
    r"^SELECT\s+(.*?)\s+FROM\s+(RECEIVE_|spanner\.receive_)(\w+)\s*\((.*)\)\s*$", re.S
)
# The documented spellings only: GoogleSQL ``lease_tokens => ['t1', @p0, ...]`` and PostgreSQL
# ``lease_tokens => ARRAY['t1', $1, ...]`` (``$n`` binds the parameter named ``pn``).
_RENEW = re.compile(
    r"^SELECT\s+(.*?)\s+FROM\s+(?:RENEWLEASE_(\w+)\s*\(\s*lease_tokens\s*=>\s*\[(.*)\]"
    r"|spanner\.renewlease_(\w+)\s*\(\s*lease_tokens\s*=>\s*ARRAY\s*\[(.*)\])\s*\)\s*$",
    re.S,
)
_RENEW_ANY = re.compile(r"\b(RENEWLEASE_|spanner\.renewlease_)", re.I)
_ASSERT = re.compile(r"\s+ASSERT_ROWS_MODIFIED\s+(\d+)\s*$", re.I)
RECEIVE_COLUMNS = {
    "delivertime": "TIMESTAMP",
    "spannerleasetoken": "STRING",
    "spannerleaseexpirationtimestamp": "TIMESTAMP",
    "spannerlastbatchmessage": "BOOL",
}
#: PostgreSQL-dialect names of RECEIVE's system columns.
PG_RECEIVE_NAMES = {
    "deliver_time": "delivertime",
    "spanner_lease_token": "spannerleasetoken",
    "spanner_lease_expiration_timestamp": "spannerleaseexpirationtimestamp",
    "spanner_last_batch_message": "spannerlastbatchmessage",
}


def renew_tokens(request: Any, match: re.Match[str]) -> list[str]:
    """The tokens of a documented RENEWLEASE call: literals and bound STRING parameters."""
    postgres = match.group(4) is not None
    items = split_top(match.group(5) if postgres else match.group(3))
    params = dict(request.params or {})
    tokens = []
    for item in items:
        literal = re.fullmatch(r"'([^']*)'", item)
        bound = re.fullmatch(r"\$(\d+)" if postgres else r"@(\w+)", item)
        if literal:
            tokens.append(literal.group(1))
            continue
        if not bound:
            raise FakeError(grpc.StatusCode.INVALID_ARGUMENT, f"bad lease token {item!r}")
        name = f"p{bound.group(1)}" if postgres else bound.group(1)
        if name not in params:
            raise FakeError(
                grpc.StatusCode.INVALID_ARGUMENT, f"No parameter found for binding: {name}"
            )
        if name in request.param_types and request.param_types[name].code != TypeCode.STRING:
            raise FakeError(grpc.StatusCode.INVALID_ARGUMENT, f"{name} must be a STRING")
        tokens.append(params[name])
    return tokens


#: Spanner's limit of query parameters in one statement.
MAX_QUERY_PARAMETERS = 950


def check_parameter_count(request: Any) -> None:
    if len(dict(request.params or {})) > MAX_QUERY_PARAMETERS:
        raise FakeError(
            grpc.StatusCode.INVALID_ARGUMENT,
            "Number of parameters in query exceeds the maximum allowed limit of "
            f"{MAX_QUERY_PARAMETERS}.",
        )


def translate(sql: str) -> str:
    sql = sql.replace("CURRENT_TIMESTAMP()", "fake_now()").replace("PARSE_JSON(", "json(")
    return re.sub(r"\bTHEN\s+RETURN\b", "RETURNING", sql, flags=re.I)


def column_types(db: FakeDatabase, sql: str) -> dict[str, str]:
    types: dict[str, str] = {}
    for name in re.findall(r"(?:FROM|JOIN|INTO|UPDATE)\s+`?(\w+)`?", sql, re.I):
        table = db.tables.get(name.lower())
        if table:
            for col, type_name in table.columns.items():
                types.setdefault(col, type_name)
    return types


def run_query(
    fake: FakeSpanner, db: FakeDatabase, conn: sqlite3.Connection, request: Any
) -> tuple[list[tuple[str, str]], list[list[Any]], int | None]:
    """Columns (name, type), wire rows, and the DML row count (None for queries)."""
    sql = request.sql.strip()
    params = params_of(request)
    if "information_schema.tables" in sql.lower():
        rows = []
        for table in db.tables.values():
            table_type = fake.queue_table_type if table.is_queue else "BASE TABLE"
            if "NOT IN ('BASE TABLE', 'VIEW')" in sql:
                if table_type in ("BASE TABLE", "VIEW"):
                    continue
                rows.append([table.name])
            else:
                rows.append([table.name, table_type])
        cols = [("table_name", "STRING")] + (
            [] if "NOT IN ('BASE TABLE'" in sql else [("table_type", "STRING")]
        )
        return cols, rows, None
    if "information_schema" in sql.lower():
        return [("x", "STRING")], [], None
    expected = None
    m = _ASSERT.search(sql)
    if m:
        expected = int(m.group(1))
        sql = sql[: m.start()]
    is_dml = re.match(r"^(INSERT|UPDATE|DELETE)\b", sql, re.I) is not None
    check_payload_values(db, sql, request)
    # A statement that fails applies nothing (Spanner's errors are statement-level).
    conn.execute("SAVEPOINT fake_statement")
    try:
        try:
            cursor = conn.execute(translate(sql), params)
            returning = is_dml and re.search(r"\bTHEN\s+RETURN\b", sql, re.I) is not None
            rows = cursor.fetchall() if (not is_dml or returning) else []
        except sqlite3.IntegrityError as exc:
            if "UNIQUE" in str(exc) or "PRIMARY KEY" in str(exc):
                raise FakeError(
                    grpc.StatusCode.ALREADY_EXISTS, f"Row already exists: {exc}"
                ) from exc
            if "FOREIGN KEY" in str(exc):  # Spanner's words
                into = _INSERT.match(sql)
                raise FakeError(
                    grpc.StatusCode.NOT_FOUND,
                    f"Parent row for row [...] in table {into.group(1) if into else '?'} is "
                    "missing. Row cannot be written.",
                ) from exc
            raise FakeError(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from exc
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc):
                raise FakeError(grpc.StatusCode.ABORTED, f"Transaction was aborted: {exc}") from exc
            raise FakeError(grpc.StatusCode.INVALID_ARGUMENT, f"{exc}: {sql}") from exc
        if is_dml:
            count = len(rows) if returning else cursor.rowcount
            if expected is not None and count != expected:
                raise FakeError(
                    grpc.StatusCode.OUT_OF_RANGE,
                    f"ASSERT_ROWS_MODIFIED expected {expected} rows modified, but found {count}",
                )
    except FakeError:
        conn.execute("ROLLBACK TO fake_statement")
        conn.execute("RELEASE fake_statement")
        raise
    conn.execute("RELEASE fake_statement")
    if is_dml:
        if not returning:
            return [], [], count
    else:
        count = None
    types = column_types(db, sql)
    names = [d[0] for d in cursor.description or []]
    col_types = []
    for i, name in enumerate(names):
        inner = re.fullmatch(r"(?:MIN|MAX)\(`?(\w+)`?\)", name, re.I)
        type_name = types.get((inner.group(1) if inner else name).lower())
        if type_name is None:
            sample = next((r[i] for r in rows if r[i] is not None), None)
            type_name = infer_type(sample) if sample is not None else "STRING"
        col_types.append((name, type_name))
    wire = [[to_wire(v, t) for v, (_, t) in zip(row, col_types, strict=True)] for row in rows]
    return col_types, wire, count


_INSERT = re.compile(r"^INSERT\s+INTO\s+`?(\w+)`?\s*\(([^)]*)\)\s*VALUES\s*(.*)$", re.I | re.S)


def check_payload_values(db: FakeDatabase, sql: str, request: Any) -> None:
    """Refuse, as Spanner does, an INSERT into a queue whose payload value has another type
    than the ``Payload`` column: a JSON column takes ``PARSE_JSON(<STRING>)`` or a JSON
    parameter, a BYTES or STRING column a parameter of its own type."""
    m = _INSERT.match(sql)
    table = db.tables.get(m.group(1).lower()) if m else None
    if table is None or not table.is_queue:
        return
    columns = [c.strip().strip("`").lower() for c in m.group(2).split(",")]
    if "payload" not in columns:
        return
    at = columns.index("payload")
    wanted = table.columns["payload"]
    for row in split_top(m.group(3)):
        expr = split_top(row.strip()[1:-1])[at]
        pm = re.fullmatch(r"(PARSE_JSON\()?@(\w+)\)?", expr, re.I)
        if pm is None:
            continue  # a literal: left to SQLite
        types = request.param_types
        given = types[pm.group(2)].code.name if pm.group(2) in types else None
        if pm.group(1):
            given = "JSON" if given in (None, "STRING") else f"PARSE_JSON({given})"
        if given is not None and given != wanted:
            raise FakeError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Value has type {given} which cannot be inserted into column Payload, "
                f"which has type {wanted}",
            )


def receive_rows(
    fake: FakeSpanner, db: FakeDatabase, queue: str, columns: list[str], batch: int
) -> list[list[Any]]:
    """Lease up to ``batch`` due messages that hold no live lease; rows in ``columns`` order."""
    table = db.tables[queue.lower()]
    key_cols = [table.names[c.lower()] for c in table.pk]
    now = datetime.now(UTC)
    with db.lock:
        conn = db.connect()
        try:
            due = conn.execute(
                f'SELECT {", ".join(f"{chr(34)}{c}{chr(34)}" for c in key_cols)}, "Payload", '
                f'"DeliverTime", "_message" FROM "{table.name}" WHERE "DeliverTime" <= ? ORDER BY '
                '"DeliverTime"',
                [ts(now)],
            ).fetchall()
        finally:
            conn.close()
        picked = []
        for row in due:
            key = tuple(row[: len(key_cols)])
            if db.live_lease(table.name, row[-1]) is None:
                picked.append(row)
            if len(picked) >= batch:
                break
        out = []
        for i, row in enumerate(picked):
            key = tuple(row[: len(key_cols)])
            token = secrets.token_urlsafe(12)
            expires = now + timedelta(seconds=fake.lease_seconds)
            db.leases[token] = Lease(table.name, key, expires, row[-1])
            values = dict(zip([c.lower() for c in key_cols], key, strict=True))
            values.update(
                payload=row[-3],
                delivertime=row[-2],
                spannerleasetoken=token,
                spannerleaseexpirationtimestamp=ts(expires),
                spannerlastbatchmessage=i == len(picked) - 1,
            )
            out.append(
                [
                    to_wire(
                        values[c.lower()],
                        RECEIVE_COLUMNS.get(c.lower(), table.columns.get(c.lower())),
                    )
                    for c in columns
                ]
            )
        return out


def renew_rows(fake: FakeSpanner, db: FakeDatabase, tokens: list[str]) -> list[list[Any]]:
    now = datetime.now(UTC)
    out = []
    with db.lock:
        conn = db.connect()
        try:
            for token in tokens:
                lease = db.leases.get(token)
                if lease is None or lease.expires <= now:
                    continue  # unknown, unparseable or expired: no row
                table = db.tables[lease.queue.lower()]
                where = " AND ".join(f'"{table.names[c.lower()]}" = ?' for c in table.pk)
                exists = conn.execute(
                    f'SELECT 1 FROM "{table.name}" WHERE {where} AND "_message" = ?',
                    [*lease.key, lease.message],
                ).fetchone()
                if not exists or db.live_lease(lease.queue, lease.message) != token:
                    out.append([token, None, None])
                    continue
                del db.leases[token]
                new = secrets.token_urlsafe(12)
                expires = now + timedelta(seconds=fake.lease_seconds)
                db.leases[new] = Lease(lease.queue, lease.key, expires, lease.message)
                out.append([token, new, ts(expires)])
        finally:
            conn.close()
    return out


# --- mutations -----------------------------------------------------------------------------
def apply_mutations(db: FakeDatabase, conn: sqlite3.Connection, mutations: Any) -> None:
    for mutation in mutations:
        kind = spanner_type_name(mutation)
        if kind in ("send", "ack"):
            op = getattr(mutation, kind)
            table = db.tables.get(op.queue.lower())
            if table is None or not table.is_queue:
                raise FakeError(grpc.StatusCode.NOT_FOUND, f"Queue not found: {op.queue}")
            key = [
                to_sqlite(v, _TYPE_CODES[table.columns[c.lower()]])
                for v, c in zip(list(op.key), table.pk, strict=True)
            ]
            where = " AND ".join(f'"{table.names[c.lower()]}" = ?' for c in table.pk)
            if kind == "ack":
                n = conn.execute(f'DELETE FROM "{table.name}" WHERE {where}', key).rowcount
                if n == 0 and not op.ignore_not_found:
                    raise FakeError(grpc.StatusCode.NOT_FOUND, "Message not found")
                continue
            deliver = now_ts()
            if op.deliver_time:
                deliver = max(ts(op.deliver_time), deliver)
            cols = [table.names[c.lower()] for c in table.pk] + ["Payload", "DeliverTime"]
            payload = op.payload
            if table.columns["payload"] == "BYTES" and isinstance(payload, str):
                payload = base64.b64decode(payload, validate=True)
            elif table.columns["payload"] == "JSON":
                try:
                    payload = json.dumps(json.loads(payload), separators=(",", ":"))
                except ValueError as exc:
                    raise FakeError(grpc.StatusCode.INVALID_ARGUMENT, f"bad JSON: {exc}") from exc
            try:
                conn.execute(
                    f'INSERT INTO "{table.name}" ({", ".join(chr(34) + c + chr(34) for c in cols)})'
                    f" VALUES ({', '.join('?' for _ in cols)})",
                    [*key, payload, deliver],
                )
            except sqlite3.IntegrityError as exc:
                raise FakeError(grpc.StatusCode.ALREADY_EXISTS, str(exc)) from exc
        elif kind in ("insert", "insert_or_update", "replace", "update"):
            write = getattr(mutation, kind)
            table = db.tables[write.table.lower()]
            for values in write.values:
                vals = [
                    to_sqlite(v, _TYPE_CODES[table.columns[c.lower()]])
                    for v, c in zip(list(values), write.columns, strict=True)
                ]
                verb = "INSERT" if kind == "insert" else "INSERT OR REPLACE"
                cols = ", ".join(f'"{c}"' for c in write.columns)
                conn.execute(
                    f'{verb} INTO "{table.name}" ({cols}) VALUES ({", ".join("?" for _ in vals)})',
                    vals,
                )
        elif kind == "delete":
            op = mutation.delete
            table = db.tables[op.table.lower()]
            if op.key_set.all_:
                conn.execute(f'DELETE FROM "{table.name}"')
            where = " AND ".join(f'"{table.names[c.lower()]}" = ?' for c in table.pk)
            for key in op.key_set.keys:
                vals = [
                    to_sqlite(v, _TYPE_CODES[table.columns[c.lower()]])
                    for v, c in zip(list(key), table.pk, strict=True)
                ]
                conn.execute(f'DELETE FROM "{table.name}" WHERE {where}', vals)


def spanner_type_name(mutation: Any) -> str:
    return type(mutation).pb(mutation).WhichOneof("operation")


# --- servicers -----------------------------------------------------------------------------
def guarded(method: Any) -> Any:
    name = method.__name__

    def wrapper(self: Any, request: Any, context: Any) -> Any:
        later = self.fake.record(name, request, context)
        try:
            response = method(self, request, context)
        except FakeError as exc:
            context.abort(exc.code, exc.message)
        if later is not None:
            context.abort(later.code, later.message)
        return response

    wrapper.__name__ = name
    return wrapper


def streaming(method: Any) -> Any:
    name = method.__name__

    def wrapper(self: Any, request: Any, context: Any) -> Any:
        later = self.fake.record(name, request, context)
        try:
            yield from method(self, request, context)
        except FakeError as exc:
            context.abort(exc.code, exc.message)
        if later is not None:
            context.abort(later.code, later.message)

    wrapper.__name__ = name
    return wrapper


class SpannerServicer(spanner_grpc.SpannerServicer):
    def __init__(self, fake: FakeSpanner) -> None:
        self.fake = fake
        self._sessions = itertools.count(1)

    @guarded
    def CreateSession(self, request: Any, context: Any) -> Any:
        self.fake.database(request.database)
        return spanner.Session(
            name=f"{request.database}/sessions/{next(self._sessions)}",
            multiplexed=request.session.multiplexed,
        )

    @guarded
    def BatchCreateSessions(self, request: Any, context: Any) -> Any:
        return spanner.BatchCreateSessionsResponse(
            session=[
                spanner.Session(name=f"{request.database}/sessions/{next(self._sessions)}")
                for _ in range(request.session_count)
            ]
        )

    @guarded
    def GetSession(self, request: Any, context: Any) -> Any:
        return spanner.Session(name=request.name)

    @guarded
    def DeleteSession(self, request: Any, context: Any) -> Any:
        return empty_pb2.Empty()

    @guarded
    def BeginTransaction(self, request: Any, context: Any) -> Any:
        db = self.fake.database(db_of_session(request.session))
        return transaction.Transaction(id=self.fake.new_txn(db, request.options))

    def _context(self, request: Any) -> tuple[FakeDatabase, Txn | None, bytes | None, bool]:
        """Database, transaction (None: single-use read), new txn id, strong single-use."""
        db = self.fake.database(db_of_session(request.session))
        selector = request.transaction
        if "begin" in selector:
            txn_id = self.fake.new_txn(db, selector.begin)
            return db, self.fake.txn(txn_id), txn_id, False
        if "id" in selector and selector.id:
            return db, self.fake.txn(selector.id), None, False
        single = selector.single_use if "single_use" in selector else None
        strong = single is None or (
            "read_only" in single and (single.read_only.strong or not _has_staleness(single))
        )
        return db, None, None, strong

    def _execute(
        self, request: Any
    ) -> tuple[list[tuple[str, str]], list[list[Any]], int | None, bytes | None]:
        check_parameter_count(request)
        db, txn, new_id, _ = self._context(request)
        scripted = self.fake.take_script(request.sql)
        if scripted is not None:
            rows, error = scripted
            if error is not None:
                raise error
            return (
                [(f"c{i}", "STRING") for i in range(len(rows[0]) if rows else 1)],
                rows or [],
                None,
                new_id,
            )
        if _RENEW_ANY.search(request.sql):
            renew = _RENEW.match(request.sql.strip())
            if renew is None:
                raise FakeError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"RENEWLEASE takes lease_tokens => [...] (GoogleSQL) or ARRAY[...] "
                    f"(PostgreSQL): {request.sql}",
                )
            rows = renew_rows(self.fake, db, renew_tokens(request, renew))
            cols = [
                ("SpannerOldLeaseToken", "STRING"),
                ("SpannerNewLeaseToken", "STRING"),
                ("SpannerLeaseExpirationTimestamp", "TIMESTAMP"),
            ]
            return cols, rows, None, new_id
        if txn is not None and txn.conn is not None:
            try:
                cols, rows, count = run_query(self.fake, db, txn.conn, request)
            except FakeError:
                if new_id is not None:  # a failed inline begin returns no transaction
                    self.fake.finish(new_id, commit=False)
                raise
        else:
            if re.match(r"^\s*(INSERT|UPDATE|DELETE)", request.sql, re.I):
                raise FakeError(grpc.StatusCode.INVALID_ARGUMENT, "DML needs a read-write txn")
            conn = db.connect()
            try:
                cols, rows, count = run_query(self.fake, db, conn, request)
            finally:
                conn.close()
        return cols, rows, count, new_id

    @guarded
    def ExecuteSql(self, request: Any, context: Any) -> Any:
        cols, rows, count, new_id = self._execute(request)
        result = result_set.ResultSet(
            metadata=metadata(cols, new_id),
            rows=[struct_pb2.ListValue(values=[pbv(v) for v in row]) for row in rows],
        )
        if count is not None:
            result.stats = result_set.ResultSetStats(row_count_exact=count)
        return result

    @streaming
    def ExecuteStreamingSql(self, request: Any, context: Any) -> Any:
        receive = _RECEIVE.match(request.sql.strip())
        if receive:
            yield from self._receive(request, context, receive)
            return
        cols, rows, count, new_id = self._execute(request)
        out = partial(rows, metadata(cols, new_id))
        if count is not None:
            out.stats = result_set.ResultSetStats(row_count_exact=count)
        yield out

    def _receive(self, request: Any, context: Any, match: re.Match[str]) -> Any:
        db, txn, _, strong = self._context(request)
        if txn is not None or not strong:
            raise FakeError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "RECEIVE_ must run as a strong read on a single-use read-only transaction",
            )
        select, function, queue, args = match.groups()
        postgres = function.startswith("spanner.")
        table = db.tables.get(queue.lower())
        if table is None or not table.is_queue:
            raise FakeError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Table-valued function not found: {function}{queue}",
            )
        selected = [c.strip().strip("`") for c in select.split(",")]
        columns = [PG_RECEIVE_NAMES.get(c, c) if postgres else c for c in selected]
        types = {**{c: t for c, t in table.columns.items()}, **RECEIVE_COLUMNS}
        unknown = [c for c in columns if c.lower() not in types]
        if unknown:
            raise FakeError(grpc.StatusCode.INVALID_ARGUMENT, f"Unrecognized name: {unknown[0]}")
        named = dict(re.findall(r"(\w+)\s*=>\s*'?([^',)]+)'?", args))
        if postgres and set(named) != {"max_batch_size", "priority", "max_duration"}:
            raise FakeError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "spanner.receive_<queue> takes max_batch_size, priority and max_duration",
            )
        named = {k: v for k, v in named.items() if v.upper() != "NULL"}
        batch = int(named.get("max_batch_size", 1))
        duration = _seconds(named.get("max_duration", "1m"))
        meta = metadata([(s, types[c.lower()]) for s, c in zip(selected, columns, strict=True)])
        scripted = self.fake.take_script(request.sql)
        if scripted is not None:
            rows, error = scripted
            if error is not None:
                raise error
            yield partial(rows or [], meta)
            return
        # Each batch carries a resume token: the Python client holds partial results back
        # until one arrives (snapshot._restart_on_unavailable).
        tokens = itertools.count(1)
        first = result_set.PartialResultSet(metadata=meta)
        if self.fake.resume_tokens:
            first.resume_token = b"r0"
        yield first
        deadline = time.monotonic() + duration
        try:
            while (
                time.monotonic() < deadline
                and context.is_active()
                and not self.fake.streams_end.is_set()
            ):
                rows = receive_rows(self.fake, db, table.name, columns, batch)
                if rows:
                    out = partial(rows)
                    if self.fake.resume_tokens:
                        out.resume_token = f"r{next(tokens)}".encode()
                    yield out
                else:
                    self.fake.streams_end.wait(0.02)
        finally:  # how the call ended: by its max_duration (or end_streams), or cancelled
            self.fake.receive_ends.append("cancelled" if not context.is_active() else "ended")

    @guarded
    def ExecuteBatchDml(self, request: Any, context: Any) -> Any:
        db, txn, new_id, _ = self._context(request)
        if txn is None or txn.conn is None:
            raise FakeError(grpc.StatusCode.INVALID_ARGUMENT, "DML needs a read-write txn")
        results = []
        for i, statement in enumerate(request.statements):
            check_parameter_count(statement)
            sub = spanner.ExecuteSqlRequest(
                sql=statement.sql, params=statement.params, param_types=statement.param_types
            )
            cols, _, count = run_query(self.fake, db, txn.conn, sub)
            rs = result_set.ResultSet(
                metadata=metadata(cols, new_id if i == 0 else None),
                stats=result_set.ResultSetStats(row_count_exact=count or 0),
            )
            results.append(rs)
        return spanner.ExecuteBatchDmlResponse(result_sets=results)

    @guarded
    def Commit(self, request: Any, context: Any) -> Any:
        db = self.fake.database(db_of_session(request.session))
        if request.transaction_id in self.fake.committed:  # a retry: the same answer
            return self.fake.committed[request.transaction_id]
        if request.transaction_id:
            txn = self.fake.txn(request.transaction_id)
            txn_id = request.transaction_id
        else:
            txn_id = self.fake.new_txn(db, request.single_use_transaction)
            txn = self.fake.txn(txn_id)
        try:
            if txn.conn is not None:
                apply_mutations(db, txn.conn, request.mutations)
        except FakeError:
            self.fake.finish(txn_id, commit=False)
            raise
        except sqlite3.OperationalError as exc:
            self.fake.finish(txn_id, commit=False)
            raise FakeError(grpc.StatusCode.ABORTED, f"Transaction was aborted: {exc}") from exc
        self.fake.finish(txn_id, commit=True)
        response = commit_response.CommitResponse(commit_timestamp=datetime.now(UTC))
        if request.transaction_id:
            self.fake.committed[request.transaction_id] = response
        return response

    @guarded
    def Rollback(self, request: Any, context: Any) -> Any:
        self.fake.finish(request.transaction_id, commit=False)
        return empty_pb2.Empty()


def _has_staleness(single: Any) -> bool:
    ro = single.read_only
    return any(
        f in ro
        for f in ("min_read_timestamp", "max_staleness", "read_timestamp", "exact_staleness")
    )


def _seconds(text: str) -> float:
    m = re.match(r"^(\d+)(ms|s|m|h)$", text.strip())
    if not m:
        raise FakeError(grpc.StatusCode.INVALID_ARGUMENT, f"bad max_duration {text!r}")
    n, unit = int(m.group(1)), m.group(2)
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def _done(response: Any) -> operations_pb2.Operation:
    op = operations_pb2.Operation(name="operations/fake", done=True)
    op.response.Pack(type(response).pb(response) if hasattr(type(response), "pb") else response)
    return op


class AdminServicer(admin_grpc.DatabaseAdminServicer):
    def __init__(self, fake: FakeSpanner) -> None:
        self.fake = fake

    @guarded
    def CreateDatabase(self, request: Any, context: Any) -> Any:
        name = re.search(r"CREATE\s+DATABASE\s+`?([\w-]+)`?", request.create_statement, re.I).group(
            1
        )
        full = f"{request.parent}/databases/{name}"
        if name in self.fake.databases:
            raise FakeError(grpc.StatusCode.ALREADY_EXISTS, f"Database already exists: {full}")
        db = FakeDatabase(name, self.fake.dir / f"{name}.sqlite3")
        conn = db.connect()
        conn.execute("PRAGMA journal_mode=WAL")
        conn.close()
        self.fake.databases[name] = db
        for statement in request.extra_statements:
            apply_ddl(db, statement, self.fake.queue_table_type)
        return _done(admin.Database(name=full, state=admin.Database.State.READY))

    @guarded
    def GetDatabase(self, request: Any, context: Any) -> Any:
        self.fake.database(request.name)
        return admin.Database(name=request.name, state=admin.Database.State.READY)

    @guarded
    def UpdateDatabaseDdl(self, request: Any, context: Any) -> Any:
        db = self.fake.database(request.database)
        for statement in request.statements:
            apply_ddl(db, statement, self.fake.queue_table_type)
        return _done(empty_pb2.Empty())

    @guarded
    def GetDatabaseDdl(self, request: Any, context: Any) -> Any:
        return admin.GetDatabaseDdlResponse(statements=self.fake.database(request.database).ddl)

    @guarded
    def DropDatabase(self, request: Any, context: Any) -> Any:
        self.fake.databases.pop(request.database.rsplit("/", 1)[-1], None)
        return empty_pb2.Empty()

"""The front's own calls to the emulator behind it, in raw protobuf over one gRPC channel.

Queue work that no Spanner API call expresses (a claim, a renewal) runs here as ordinary
read-write transactions on sessions the front creates for itself, begun by their first read
(no ``BeginTransaction`` call) and run one at a time: the emulator allows one read-write
transaction at a time and aborts the loser, so two of the front's own would only abort each
other; one a client runs still can, and ``run_in_transaction`` retries.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc
from google.cloud.spanner_admin_database_v1.types import spanner_database_admin as admin_types
from google.cloud.spanner_v1.types import (
    commit_response,
    keys,
    mutation,
    result_set,
    spanner,
    transaction,
)
from google.cloud.spanner_v1.types import type as spanner_type
from google.protobuf import empty_pb2, struct_pb2

SPANNER = "/google.spanner.v1.Spanner/"
ADMIN = "/google.spanner.admin.database.v1.DatabaseAdmin/"

ExecuteSqlRequest = spanner.ExecuteSqlRequest.pb()
CommitRequest = spanner.CommitRequest.pb()
ExecuteBatchDmlRequest = spanner.ExecuteBatchDmlRequest.pb()
ExecuteBatchDmlResponse = spanner.ExecuteBatchDmlResponse.pb()
BatchWriteRequest = spanner.BatchWriteRequest.pb()
BatchWriteResponse = spanner.BatchWriteResponse.pb()
CommitResponse = commit_response.CommitResponse.pb()
BeginTransactionRequest = spanner.BeginTransactionRequest.pb()
RollbackRequest = spanner.RollbackRequest.pb()
ReadRequest = spanner.ReadRequest.pb()
CreateSessionRequest = spanner.CreateSessionRequest.pb()
Session = spanner.Session.pb()
ResultSet = result_set.ResultSet.pb()
PartialResultSet = result_set.PartialResultSet.pb()
ResultSetMetadata = result_set.ResultSetMetadata.pb()
Transaction = transaction.Transaction.pb()
TransactionOptions = transaction.TransactionOptions.pb()
TransactionSelector = transaction.TransactionSelector.pb()
Mutation = mutation.Mutation.pb()
KeySet = keys.KeySet.pb()
Type = spanner_type.Type.pb()
StructType = spanner_type.StructType.pb()
TypeCode = spanner_type.TypeCode
GetDatabaseDdlRequest = admin_types.GetDatabaseDdlRequest.pb()
GetDatabaseDdlResponse = admin_types.GetDatabaseDdlResponse.pb()
Empty = empty_pb2.Empty
ListValue = struct_pb2.ListValue
Value = struct_pb2.Value

T = TypeVar("T")


def _call(channel: grpc.Channel, path: str, response: Any) -> Callable[..., Any]:
    return channel.unary_unary(
        path,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=response.FromString,
    )


class Txn:
    """A read-write transaction of the front's own (``Backend.transact``): begun by its first
    read or query, Spanner's inline begin; ``id`` is None until then. One that reads nothing
    commits its mutations as a single-use transaction."""

    __slots__ = ("id",)

    def __init__(self) -> None:
        self.id: bytes | None = None


def _selector(transaction: bytes | Txn | None) -> Any:
    """The ``TransactionSelector`` of a read in ``transaction``: a strong single-use read when
    None, an inline begin for a ``Txn`` not begun yet."""
    if transaction is None:
        return TransactionSelector(
            single_use=TransactionOptions(read_only=TransactionOptions.ReadOnly(strong=True))
        )
    if isinstance(transaction, Txn):
        if transaction.id is None:
            return TransactionSelector(begin=_READ_WRITE)
        return TransactionSelector(id=transaction.id)
    return TransactionSelector(id=transaction)


def _begun(transaction: bytes | Txn | None, result: Any) -> Any:
    """``result`` of a read in ``transaction``, whose id it records when the read began it."""
    if isinstance(transaction, Txn) and transaction.id is None:
        transaction.id = result.metadata.transaction.id
    return result


class Backend:
    """Calls to the emulator the front stands before."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self._create_session = _call(channel, SPANNER + "CreateSession", Session)
        self._execute = _call(channel, SPANNER + "ExecuteSql", ResultSet)
        self._read = _call(channel, SPANNER + "Read", ResultSet)
        self._commit = _call(channel, SPANNER + "Commit", CommitResponse)
        self._rollback = _call(channel, SPANNER + "Rollback", Empty)
        self._ddl = _call(channel, ADMIN + "GetDatabaseDdl", GetDatabaseDdlResponse)
        self._sessions: dict[str, queue.SimpleQueue[str]] = {}
        self._lock = threading.Lock()
        #: held by each attempt of the front's own read-write transactions (``transact``)
        self._serial = threading.Lock()

    # --- sessions ------------------------------------------------------------------------
    @contextmanager
    def session(self, database: str) -> Iterator[str]:
        """A session of the front's own on ``database``, returned to a pool afterwards."""
        with self._lock:
            pool = self._sessions.setdefault(database, queue.SimpleQueue())
        try:
            name = pool.get_nowait()
        except queue.Empty:
            name = self._create_session(CreateSessionRequest(database=database)).name
        try:
            yield name
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # a lost session is not pooled
                pool.put(name)
            raise
        else:
            pool.put(name)

    def forget(self, database: str) -> None:
        with self._lock:
            self._sessions.pop(database, None)

    # --- calls ---------------------------------------------------------------------------
    def database_ddl(self, database: str) -> list[str]:
        return list(self._ddl(GetDatabaseDdlRequest(database=database)).statements)

    def query(
        self,
        session: str,
        sql: str,
        *,
        transaction_id: bytes | Txn | None = None,
        params: dict[str, tuple[Any, int]] | None = None,
        seqno: int = 0,
    ) -> Any:
        """Run ``sql``; in ``transaction_id`` (a client's, or the front's own ``Txn``) or a
        strong single-use read. ``params`` maps a name to (protobuf ``Value``, ``TypeCode``)."""
        selector = _selector(transaction_id)
        request = ExecuteSqlRequest(session=session, sql=sql, transaction=selector, seqno=seqno)
        for name, (value, code) in (params or {}).items():
            request.params.fields[name].CopyFrom(value)
            request.param_types[name].CopyFrom(_type(code))
        return _begun(transaction_id, self._execute(request))

    def read(
        self,
        session: str,
        table: str,
        columns: Sequence[str],
        key_values: Sequence[Any],
        *,
        transaction_id: bytes | Txn | None = None,
    ) -> Any:
        """Read ``columns`` of the rows whose keys are ``key_values`` (``ListValue`` each)."""
        key_set = KeySet()
        for key in key_values:
            key_set.keys.add().CopyFrom(key)
        request = ReadRequest(
            session=session,
            table=table,
            columns=list(columns),
            key_set=key_set,
            transaction=_selector(transaction_id),
        )
        return _begun(transaction_id, self._read(request))

    def commit(self, session: str, transaction_id: bytes | Txn, mutations: Sequence[Any]) -> Any:
        if isinstance(transaction_id, Txn) and transaction_id.id is None:
            request = CommitRequest(session=session, single_use_transaction=_READ_WRITE)
        else:
            begun = transaction_id.id if isinstance(transaction_id, Txn) else transaction_id
            request = CommitRequest(session=session, transaction_id=begun)
        request.mutations.extend(mutations)
        return self._commit(request)

    def rollback(self, session: str, transaction_id: bytes | Txn) -> None:
        if isinstance(transaction_id, Txn):
            if transaction_id.id is None:
                return  # never begun (or its first read was refused): nothing to undo
            transaction_id = transaction_id.id
        try:
            self._rollback(RollbackRequest(session=session, transaction_id=transaction_id))
        except grpc.RpcError:
            pass  # already finished or aborted: nothing to undo

    def run_in_transaction(
        self,
        database: str,
        work: Callable[[str, Txn], tuple[T, Sequence[Any]]],
        *,
        attempts: int = 100,
    ) -> T:
        """Run ``work(session, txn)`` -> (result, mutations) and commit the mutations; again
        on ABORTED (the emulator aborts one of two concurrent read-write transactions)."""
        return self.transact(database, work, attempts=attempts)[0]

    def transact(
        self,
        database: str,
        work: Callable[[str, Txn], tuple[T, Sequence[Any]]],
        *,
        attempts: int = 100,
    ) -> tuple[T, Any]:
        """``run_in_transaction`` that also returns the ``CommitResponse``."""
        delay = 0.002
        for attempt in range(attempts):
            with self._serial, self.session(database) as session:
                txn = Txn()
                try:
                    result, mutations = work(session, txn)
                    return result, self.commit(session, txn, mutations)
                except grpc.RpcError as exc:
                    self.rollback(session, txn)
                    if exc.code() != grpc.StatusCode.ABORTED or attempt == attempts - 1:
                        raise
                except BaseException:
                    self.rollback(session, txn)
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        raise AssertionError("unreachable")


def _type(code: int) -> Any:
    return Type(code=code)


_READ_WRITE = TransactionOptions(read_write=TransactionOptions.ReadWrite())


def rows(result: Any) -> list[list[Any]]:
    """The rows of a ``ResultSet`` as lists of protobuf ``Value``."""
    return [list(row.values) for row in result.rows]


def string_value(text: str | None) -> Any:
    return Value(null_value=struct_pb2.NULL_VALUE) if text is None else Value(string_value=text)


def bool_value(flag: bool) -> Any:
    return Value(bool_value=flag)


def field_type(code: int) -> Any:
    return Type(code=code)


def update_mutation(table: str, columns: Sequence[str], values: Sequence[Sequence[Any]]) -> Any:
    write = mutation.Mutation.Write.pb()(table=table, columns=list(columns))
    for row in values:
        write.values.add().values.extend(row)
    return Mutation(update=write)

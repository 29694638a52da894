"""The queue-aware front: a gRPC server that speaks the whole Cloud Spanner API on one port and
stands before a private emulator.

Every call goes to the emulator byte for byte, except the few that queues change:

- ``DatabaseAdmin.UpdateDatabaseDdl`` / ``CreateDatabase``: ``CREATE QUEUE``, ``DROP QUEUE`` and
  ``ALTER QUEUE`` become table DDL (``schema``); ``GetDatabaseDdl`` shows queues as declared.
- ``Spanner.ExecuteStreamingSql``: ``RECEIVE_<Q>(...)`` is served by the front as a
  long-running stream of batches on a strong single-use read (``receiving``);
  ``ExecuteSql``/``ExecuteStreamingSql``: ``RENEWLEASE_<Q>(...)`` (``queues.renew``); ``UPDATE``
  of a queue is refused, as Spanner does, and so are ``INSERT OR UPDATE`` and
  ``INSERT OR IGNORE``, and DML Google never shows on a queue: ``THEN RETURN``,
  ``INSERT ... SELECT``, a ``DELETE`` that does not filter on the key
  (``statements.undocumented_queue_dml``).
- ``Spanner.Commit``: ``Send`` and ``Ack`` mutations become writes on the queue's table; an
  ``Ack`` that finds no message fails the commit with ``NOT_FOUND`` and nothing of it applies.
  A commit that sent to a queue (a ``Send``, or an ``INSERT`` the front saw in its transaction)
  wakes that queue's idle RECEIVE streams, and only that one's (``receiving``).
- ``Spanner.BatchWrite`` (the emulator has none): the front applies each mutation group as one
  read-write transaction, translated as a commit is, and streams one response per group (its
  index, its status, its commit timestamp when applied); a group that fails leaves the others.
- ``Spanner.BeginTransaction``: read-only strong transactions are remembered, so RECEIVE can
  tell a strong read from a stale one or a read-write transaction.

The front owns its port (``SO_REUSEPORT`` off: ``AddressInUse`` when it is taken); once its
emulator is gone (``Front.backend_lost``) every call ends ``UNAVAILABLE`` saying why. Tests make
it fail chosen calls, and see what was sent, through its control API (``faults``).
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from typing import Any

import grpc

from spanner_queues_emulator import backend as b
from spanner_queues_emulator import queues as q
from spanner_queues_emulator import schema as s
from spanner_queues_emulator import statements as st
from spanner_queues_emulator import status
from spanner_queues_emulator.answers import BACKOFF_POLICIES
from spanner_queues_emulator.ddl_calls import DropDatabaseRequest, SchemaCalls
from spanner_queues_emulator.faults import CONTROL, Fault, Faults, wire_value
from spanner_queues_emulator.receiving import (
    Receiving,
    is_strong_read,
    receive_args,
    receive_fields,
)

logger = logging.getLogger("spanner_queues_emulator")


#: server-streaming methods of the Spanner API (every other method is unary-unary).
STREAMING = frozenset(
    {b.SPANNER + "ExecuteStreamingSql", b.SPANNER + "StreamingRead", b.SPANNER + "BatchWrite"}
)
#: how many read-write transactions' sends (queues INSERTed into) are remembered until their
#: commit or rollback (the oldest are forgotten first: one abandoned is never committed).
SENDS_KEPT = 10000
#: a method of the front's own: answers ``{"queues": true}`` (the plain emulator answers
#: UNIMPLEMENTED), so a client can tell whether the server it talks to has queues.
DESCRIBE = "/spanner_queues.emulator.Front/Describe"
#: the front's control methods (``faults``): ``/spanner_queues.emulator.Front/Fail``...
CONTROL_METHODS = {f"/spanner_queues.emulator.Front/{name}": name for name in CONTROL}


class AddressInUse(RuntimeError):
    """The front cannot listen on its address: another front or server holds the port (or
    the address is not one of this machine's)."""


def _database_of(session_or_db: str) -> str:
    parts = session_or_db.split("/")
    return "/".join(parts[:6])


class Front:
    """The front's request handling; ``serve()`` puts it on a port."""

    def __init__(
        self,
        backend_address: str,
        *,
        short_receive: str = "generous",
        backoff: str = "exponential",
        retry_info: str = "always",
        deliver_time: str = "kept",
    ) -> None:
        self.backend_address = backend_address
        self.channel = grpc.insecure_channel(
            backend_address,
            options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
        )
        self.backend = b.Backend(self.channel)
        self.schema = SchemaCalls(self.backend, self.forward)
        #: injected faults and the request record (``spanner_queues_emulator.faults``).
        self.faults = Faults(
            short_receive=short_receive,
            backoff=backoff,
            retry_info=retry_info,
            deliver_time=deliver_time,
        )
        self.receiving = Receiving(
            self.backend,
            started=self.faults.receive_started,
            resume_tokens=lambda: self.faults.resume_tokens,
            short_receive=lambda: self.faults.short_receive,
            backoff=lambda: self.faults.backoff,
            deliver_time=lambda: self.faults.deliver_time,
        )
        #: why the emulator behind the front is gone, once it is (``backend_lost``).
        self.lost: str | None = None
        #: queues INSERTed into per open read-write transaction, and the databases where a
        #: transaction the front could not name did so (their next commit wakes every queue)
        self._sends: collections.OrderedDict[bytes, set[str]] = collections.OrderedDict()
        self._unnamed: set[str] = set()
        self._sends_lock = threading.Lock()

    def shutdown(self) -> None:
        """End open RECEIVE streams."""
        self.receiving.shutdown()

    def backend_lost(self, reason: str) -> None:
        """The emulator is gone for good: from now on every call ends ``UNAVAILABLE`` with
        ``reason``, and open RECEIVE streams end."""
        self.lost = reason
        self.receiving.shutdown()

    # --- catalog (SchemaCalls) ------------------------------------------------------------
    def catalog(self, database: str) -> dict[str, s.QueueSchema]:
        return self.schema.catalog(database)

    # --- routing -------------------------------------------------------------------------
    def handler(self, method: str) -> grpc.RpcMethodHandler:
        if self.lost is not None:
            return self._unavailable(method, self.lost)
        if method == DESCRIBE:
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: json.dumps(
                    {"queues": True, "dialects": ["googlesql"], "faults": True}
                ).encode()
            )
        if method in CONTROL_METHODS:
            return grpc.unary_unary_rpc_method_handler(self._control(CONTROL_METHODS[method]))
        own: dict[str, Callable[..., Any]] = {
            b.ADMIN + "UpdateDatabaseDdl": self.schema.update_ddl,
            b.ADMIN + "CreateDatabase": self.schema.create_database,
            b.ADMIN + "GetDatabaseDdl": self.schema.get_ddl,
            b.ADMIN + "DropDatabase": self.drop_database,
            b.SPANNER + "ExecuteSql": self.execute_sql,
            b.SPANNER + "ExecuteBatchDml": self.execute_batch_dml,
            b.SPANNER + "Commit": self.commit,
            b.SPANNER + "BeginTransaction": self.begin_transaction,
            b.SPANNER + "Rollback": self.rollback,
        }
        if method == b.SPANNER + "ExecuteStreamingSql":
            return self._streaming(method, self._logged(self.execute_streaming_sql))
        if method == b.SPANNER + "BatchWrite":
            return self._streaming(method, self._logged(self.batch_write))
        if method in own:
            return self._unary(method, self._guarded(method, own[method]))
        if method in STREAMING:
            return self._streaming(
                method, lambda request, context: self.forward_stream(method, request, context)
            )
        return self._unary(method, lambda request, context: self.forward(method, request, context))

    # --- injected faults (faults.Faults) ---------------------------------------------------
    def _control(self, name: str) -> Callable[[bytes, Any], bytes]:
        def call(request: bytes, context: Any) -> bytes:
            try:
                body = json.loads(request or b"{}")
                return json.dumps(
                    self.faults.control(name, body, self.receiving.end_streams)
                ).encode()
            except (ValueError, TypeError) as exc:
                status.abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))

        return call

    def _fault(self, method: str, request: bytes, context: Any) -> Fault | None:
        """The fault this call takes, if any; one that is not ``after`` ends it now."""
        fault = self.faults.arrived(method.rsplit("/", 1)[-1], request)
        if fault is None or fault.after:
            return fault
        if method == b.SPANNER + "Commit":
            req = b.CommitRequest.FromString(request)
            if req.transaction_id:  # Spanner drops the transaction of a failed commit
                self.backend.rollback(req.session, req.transaction_id)
        status.abort(context, fault.status, fault.message)

    def _unary(self, method: str, fn: Callable[[bytes, Any], bytes]) -> grpc.RpcMethodHandler:
        def call(request: bytes, context: Any) -> bytes:
            status.WITH_RETRY_INFO.set(self.faults.retry_info == "always")
            fault = self._fault(method, request, context)
            response = fn(request, context)
            if fault is not None:  # after: applied, the answer replaced by the fault
                status.abort(context, fault.status, fault.message)
            return response

        return grpc.unary_unary_rpc_method_handler(call)

    def _streaming(
        self, method: str, fn: Callable[[bytes, Any], Iterator[bytes]]
    ) -> grpc.RpcMethodHandler:
        def call(request: bytes, context: Any) -> Iterator[bytes]:
            status.WITH_RETRY_INFO.set(self.faults.retry_info == "always")
            fault = self._fault(method, request, context)
            yield from fn(request, context)
            if fault is not None:
                status.abort(context, fault.status, fault.message)

        return grpc.unary_stream_rpc_method_handler(call)

    @staticmethod
    def _unavailable(method: str, reason: str) -> grpc.RpcMethodHandler:
        def refuse(request: bytes, context: Any) -> Any:
            status.abort(context, grpc.StatusCode.UNAVAILABLE, reason)

        if method in STREAMING:
            return grpc.unary_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)

    @staticmethod
    def _logged(fn: Callable[[bytes, Any], Iterator[bytes]]) -> Callable[..., Iterator[bytes]]:
        def call(request: bytes, context: Any) -> Iterator[bytes]:
            try:
                yield from fn(request, context)
            except status.Aborted:
                raise
            except Exception as exc:
                if isinstance(exc, grpc.RpcError) or not context.is_active():
                    raise
                logger.exception("the emulator front failed on a streaming call")
                status.abort(context, grpc.StatusCode.INTERNAL, f"emulator front: {exc!r}")

        return call

    def _guarded(self, method: str, fn: Callable[[bytes, Any], bytes]) -> Callable[..., bytes]:
        def call(request: bytes, context: Any) -> bytes:
            try:
                return fn(request, context)
            except status.Aborted:
                raise
            except q.QueueRefusal as refusal:
                status.abort(context, status.code(refusal.code), str(refusal))
            except (st.StatementError, s.QueueDdlError, ValueError) as exc:
                status.abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except grpc.RpcError as exc:
                status.abort_with(context, exc)
            except Exception as exc:
                if not context.is_active():
                    raise
                logger.exception("the emulator front failed on %s", method)
                status.abort(context, grpc.StatusCode.INTERNAL, f"emulator front: {exc!r}")
            raise AssertionError("unreachable")

        return call

    # --- pass-through --------------------------------------------------------------------
    @staticmethod
    def _metadata(context: Any) -> tuple[tuple[str, str | bytes], ...]:
        return tuple(
            (k, v)
            for k, v in context.invocation_metadata()
            if not k.startswith(status.SKIP_HEADERS)
        )

    @staticmethod
    def _timeout(context: Any) -> float | None:
        remaining = context.time_remaining()
        return remaining if remaining is not None and remaining < 10**8 else None

    def forward(self, method: str, request: bytes, context: Any) -> bytes:
        call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self.channel.unary_unary(method)
        try:
            return call(request, metadata=self._metadata(context), timeout=self._timeout(context))
        except grpc.RpcError as exc:
            status.abort_with(context, exc)
            raise

    def forward_stream(self, method: str, request: bytes, context: Any) -> Iterator[bytes]:
        stream: grpc.UnaryStreamMultiCallable[bytes, bytes] = self.channel.unary_stream(method)
        call = stream(request, metadata=self._metadata(context), timeout=self._timeout(context))
        context.add_callback(call.cancel)
        try:
            yield from call
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED or context.is_active():
                status.abort_with(context, exc)

    # --- DDL -----------------------------------------------------------------------------
    # --- transactions --------------------------------------------------------------------
    def begin_transaction(self, request: bytes, context: Any) -> bytes:
        response = self.forward(b.SPANNER + "BeginTransaction", request, context)
        options = b.BeginTransactionRequest.FromString(request).options
        if is_strong_read(options):
            self.receiving.remember_strong_read(b.Transaction.FromString(response).id)
        return response

    def drop_database(self, request: bytes, context: Any) -> bytes:
        response = self.schema.drop_database(request, context)
        self.receiving.forget(DropDatabaseRequest.FromString(request).database)
        return response

    def rollback(self, request: bytes, context: Any) -> bytes:
        response = self.forward(b.SPANNER + "Rollback", request, context)
        with self._sends_lock:
            self._sends.pop(b.RollbackRequest.FromString(request).transaction_id, None)
        return response

    def commit(self, request: bytes, context: Any) -> bytes:
        req = b.CommitRequest.FromString(request)
        database = _database_of(req.session)
        committed = self._committed_by(database, req.transaction_id, _sent(req.mutations))
        ops = {m.WhichOneof("operation") for m in req.mutations}
        if not ops & {"send", "ack", "insert", "update", "insert_or_update", "replace"}:
            return committed(self.forward(b.SPANNER + "Commit", request, context))
        translated = q.translate_mutations(req.mutations, self.catalog(database))
        del req.mutations[:]
        req.mutations.extend(translated.mutations)
        if not translated.must_exist:
            return committed(self.forward(b.SPANNER + "Commit", req.SerializeToString(), context))
        if req.HasField("single_use_transaction"):
            return committed(self._checked_blind_commit(database, translated).SerializeToString())
        try:
            missing = q.missing_acks(
                self.backend, req.session, req.transaction_id, translated.must_exist
            )
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            # The transaction has ended: a retried Commit (the client retries UNAVAILABLE),
            # which Spanner answers as it answered the first; so does the emulator.
            return committed(self.forward(b.SPANNER + "Commit", req.SerializeToString(), context))
        if missing:
            self.backend.rollback(req.session, req.transaction_id)
            raise _ack_not_found(missing)
        return committed(self.forward(b.SPANNER + "Commit", req.SerializeToString(), context))

    def _checked_blind_commit(self, database: str, translated: q.Translated) -> Any:
        """A blind batch whose Acks must find their messages, as one read-write transaction
        on the front's own session (again on ABORTED); its ``CommitResponse``."""

        def work(session: str, txn: b.Txn) -> tuple[None, list[Any]]:
            if translated.must_exist:
                missing = q.missing_acks(self.backend, session, txn, translated.must_exist)
                if missing:
                    raise _ack_not_found(missing)
            return None, translated.mutations

        _, response = self.backend.transact(database, work)
        return response

    def batch_write(self, request: bytes, context: Any) -> Iterator[bytes]:
        """Each mutation group as one read-write transaction, in request order, translated as
        a commit is: a group applies whole or not at all, whatever the other groups do. One
        response per group: ``indexes`` = [its index], ``status`` OK and the commit timestamp,
        or the status of its failure (``NOT_FOUND`` for an Ack that finds no message)."""
        req = b.BatchWriteRequest.FromString(request)
        database = _database_of(req.session)
        try:
            catalog = self.catalog(database)
        except grpc.RpcError as exc:  # no such database: the call fails, not each group
            status.abort_with(context, exc)
        for index, group in enumerate(req.mutation_groups):
            if not context.is_active():
                return  # cancelled: later groups are not applied
            response = b.BatchWriteResponse(indexes=[index])
            response.status.SetInParent()
            try:
                translated = q.translate_mutations(group.mutations, catalog)
                committed = self._checked_blind_commit(database, translated)
            except q.QueueRefusal as refusal:
                _failed(response, status.code(refusal.code), str(refusal))
            except (st.StatementError, ValueError) as exc:
                _failed(response, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except grpc.RpcError as exc:
                _failed(response, exc.code(), status.in_spanner_words(exc.details() or ""))
            else:
                response.commit_timestamp.CopyFrom(committed.commit_timestamp)
                if sent := _sent(group.mutations):
                    self.receiving.committed(database, sent)
            yield response.SerializeToString()

    # --- sends: which RECEIVE streams a commit wakes --------------------------------------
    def _committed_by(
        self, database: str, transaction_id: bytes, sent: set[str]
    ) -> Callable[[bytes], bytes]:
        """What passes a commit's response on once it succeeded: it wakes the streams of the
        queues the commit sent to (``sent``, its ``Send`` mutations, and what its transaction
        INSERTed), of every queue when a transaction the front could not name INSERTed into
        one, and none when it sent nothing (an ack makes nothing due)."""

        def committed(response: bytes) -> bytes:
            with self._sends_lock:
                queues: set[str] | None = sent | self._sends.pop(transaction_id, set())
                if database in self._unnamed:
                    self._unnamed.discard(database)
                    queues = None
            if queues is None:
                self.receiving.committed()
            elif queues:
                self.receiving.committed(database, queues)
            return response

        return committed

    def _queue_inserts(self, database: str, sqls: Iterable[str]) -> set[str]:
        """The queues among the tables ``sqls`` INSERT into."""
        tables = {t for t in map(st.inserted_table, sqls) if t is not None}
        if not tables:
            return set()
        catalog = self.catalog(database)
        return {catalog[t.upper()].name for t in tables if t.upper() in catalog}

    def _note_sends(
        self,
        database: str,
        selector: Any,
        queues: set[str],
        answer: bytes,
        begun: Callable[[bytes], bytes],
    ) -> None:
        """A statement of the transaction ``selector`` names INSERTed into ``queues`` (one it
        began inline: ``begun(answer)`` is its id): its commit will wake them."""
        if not queues:
            return
        kind = selector.WhichOneof("selector")
        try:
            transaction_id = (
                selector.id if kind == "id" else begun(answer) if kind == "begin" else b""
            )
        except Exception:  # (an answer the front cannot read: it wakes every queue)
            transaction_id = b""
        with self._sends_lock:
            if not transaction_id:
                self._unnamed.add(database)
                return
            self._sends.setdefault(transaction_id, set()).update(queues)
            self._sends.move_to_end(transaction_id)
            while len(self._sends) > SENDS_KEPT:
                self._sends.popitem(last=False)

    # --- SQL -----------------------------------------------------------------------------
    def _queue_call(self, req: Any) -> tuple[st.QueueCall, s.QueueSchema] | None:
        mention = st.mentioned_function(req.sql)
        if mention is None:
            return None
        catalog = self.catalog(_database_of(req.session))
        queue = catalog.get(mention[1].upper())
        if queue is None:
            return None  # not a queue: the emulator says "Table-valued function not found"
        call = st.parse_call(req.sql, _param_values(req))
        return call, queue

    def _refuse_update(self, database: str, sql: str) -> None:
        """Refuse ``UPDATE``, ``INSERT OR UPDATE`` and ``INSERT OR IGNORE`` on a queue, and DML
        in forms Google never shows for queues (``statements.undocumented_queue_dml``)."""
        found = st.queue_write(sql)
        if found is None:
            table = st.dml_table(sql)
            queue = self.catalog(database).get(table.upper()) if table else None
            why = st.undocumented_queue_dml(sql, queue.keys) if queue is not None else None
            if queue is not None and why is not None:
                raise q.QueueRefusal(
                    "INVALID_ARGUMENT",
                    f"{why} is not supported on queue {queue.name}: Google documents INSERT "
                    "... VALUES to send and DELETE ... WHERE <key> = ... "
                    "[ASSERT_ROWS_MODIFIED 1] to ack or delete a message",
                )
            return
        what, table = found
        queue = self.catalog(database).get(table.upper())
        if queue is not None:
            raise q.QueueRefusal(
                "INVALID_ARGUMENT",
                f"{what} is not supported on queue {queue.name}: send with INSERT or a Send "
                "mutation; replace a message with DELETE then INSERT (or Ack then Send) in one "
                "transaction",
            )

    def _scripted(
        self, req: Any, found: tuple[st.QueueCall, s.QueueSchema] | None, context: Any
    ) -> tuple[list[tuple[str, Any]], list[list[Any]]] | None:
        """The scripted answer to ``req`` (``faults.Scripted``): (fields, rows), or None."""
        script = self.faults.scripted(req.sql)
        if script is None:
            return None
        if script.error is not None:
            status.abort(context, script.error.status, script.error.message)
        rows = [[wire_value(v) for v in row] for row in script.rows]
        if found is None:
            width = len(script.rows[0]) if script.rows else 1
            return [(f"c{i}", b.field_type(b.TypeCode.STRING)) for i in range(width)], rows
        call, queue = found
        if call.kind == "RECEIVE":
            fields = receive_fields(self.backend, _database_of(req.session), queue)
        else:
            fields = q.renew_fields()
        return q.project(fields, [], call.columns)[0], rows

    def execute_sql(self, request: bytes, context: Any) -> bytes:
        req = b.ExecuteSqlRequest.FromString(request)
        st.check_parameter_count(len(req.params.fields))
        found = self._queue_call(req)
        scripted = self._scripted(req, found, context)
        if scripted is not None:
            result = b.ResultSet(metadata=q.metadata(scripted[0]))
            for row in scripted[1]:
                result.rows.add().values.extend(row)
            return result.SerializeToString()
        if found is None:
            database = _database_of(req.session)
            self._refuse_update(database, req.sql)
            response = self.forward(b.SPANNER + "ExecuteSql", request, context)
            self._note_sends(
                database,
                req.transaction,
                self._queue_inserts(database, [req.sql]),
                response,
                _begun_result,
            )
            return response
        call, queue = found
        if call.kind == "RECEIVE":
            raise q.QueueRefusal(
                "INVALID_ARGUMENT",
                f"RECEIVE_{queue.name} is a long-running query: run it with "
                "ExecuteStreamingSql in a strong single-use read-only transaction",
            )
        fields, rows = self._renew(req, call, queue)
        result = b.ResultSet(metadata=q.metadata(fields))
        for row in rows:
            result.rows.add().values.extend(row)
        return result.SerializeToString()

    def execute_batch_dml(self, request: bytes, context: Any) -> bytes:
        req = b.ExecuteBatchDmlRequest.FromString(request)
        database = _database_of(req.session)
        for statement in req.statements:
            if st.mentioned_function(statement.sql):
                raise q.QueueRefusal(
                    "INVALID_ARGUMENT", "RECEIVE and RENEWLEASE are queries, not DML"
                )
            self._refuse_update(database, statement.sql)
        response = self.forward(b.SPANNER + "ExecuteBatchDml", request, context)

        self._note_sends(
            database,
            req.transaction,
            self._queue_inserts(database, [x.sql for x in req.statements]),
            response,
            _begun_batch,
        )
        return response

    def execute_streaming_sql(self, request: bytes, context: Any) -> Iterator[bytes]:
        found = None
        try:
            req = b.ExecuteSqlRequest.FromString(request)
            st.check_parameter_count(len(req.params.fields))
            found = self._queue_call(req)
            scripted = self._scripted(req, found, context)
            if scripted is not None:
                partial = b.PartialResultSet(metadata=q.metadata(scripted[0]), last=True)
                if self.faults.resume_tokens:
                    partial.resume_token = b"scripted"
                for row in scripted[1]:
                    partial.values.extend(row)
                yield partial.SerializeToString()
                return
            if found is None:
                self._refuse_update(_database_of(req.session), req.sql)
            elif found[0].kind == "RENEWLEASE":
                fields, rows = self._renew(req, *found)
                partial = b.PartialResultSet(metadata=q.metadata(fields), last=True)
                for row in rows:
                    partial.values.extend(row)
                yield partial.SerializeToString()
                return
            else:  # RECEIVE: its arguments and columns are checked before it leases a row
                receive_args(found[0].args)
                q.check_columns(q.receive_names(found[1]), found[0].columns)
        except q.QueueRefusal as refusal:
            status.abort(context, status.code(refusal.code), str(refusal))
        except (st.StatementError, ValueError) as exc:
            status.abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except grpc.RpcError as exc:
            status.abort_with(context, exc)
        if found is None:
            database = _database_of(req.session)
            sends = self._queue_inserts(database, [req.sql])
            for n, chunk in enumerate(
                self.forward_stream(b.SPANNER + "ExecuteStreamingSql", request, context)
            ):
                if n == 0 and sends:
                    self._note_sends(database, req.transaction, sends, chunk, _begun_partial)
                yield chunk
            return
        call, queue = found
        yield from self.receiving.stream(req, _database_of(req.session), call, queue, context)

    def _renew(
        self, req: Any, call: st.QueueCall, queue: s.QueueSchema
    ) -> tuple[list[tuple[str, Any]], list[list[Any]]]:
        tokens = call.args["lease_tokens"]
        rows = q.renew(
            self.backend,
            _database_of(req.session),
            queue,
            tokens,
            BACKOFF_POLICIES[self.faults.backoff],
            self.faults.deliver_time,
        )
        return q.project(q.renew_fields(), rows, call.columns)


def _param_values(req: Any) -> dict[str, Any]:
    """The request's parameters as Python values (INT64 -> int, arrays -> lists)."""
    out: dict[str, Any] = {}
    for name, value in req.params.fields.items():
        out[name] = _python(value, req.param_types.get(name))
    return out


def _python(value: Any, type_: Any) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "null_value" or kind is None:
        return None
    if kind == "list_value":
        element = type_.array_element_type if type_ is not None else None
        return [_python(v, element) for v in value.list_value.values]
    if kind == "string_value":
        if type_ is not None and type_.code == b.TypeCode.INT64:
            return int(value.string_value)
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "number_value":
        return int(value.number_value) if value.number_value.is_integer() else value.number_value
    return None


def _begun_result(answer: bytes) -> bytes:
    return bytes(b.ResultSet.FromString(answer).metadata.transaction.id)


def _begun_partial(answer: bytes) -> bytes:
    return bytes(b.PartialResultSet.FromString(answer).metadata.transaction.id)


def _begun_batch(answer: bytes) -> bytes:
    sets = b.ExecuteBatchDmlResponse.FromString(answer).result_sets
    return bytes(sets[0].metadata.transaction.id) if sets else b""


def _sent(mutations: Iterable[Any]) -> set[str]:
    """The queues of the ``Send`` mutations among ``mutations``."""
    return {m.send.queue for m in mutations if m.WhichOneof("operation") == "send"}


def _failed(response: Any, code: grpc.StatusCode, message: str) -> None:
    response.status.code = code.value[0]
    response.status.message = message


def _ack_not_found(missing: list[tuple[s.QueueSchema, Any]]) -> q.QueueRefusal:
    queue, key = missing[0]
    values = [q.json_format.MessageToDict(v) for v in key.values]
    return q.QueueRefusal("NOT_FOUND", f"Message not found: queue {queue.name}, key {values}")


def serve(
    backend_address: str,
    host_port: str,
    *,
    max_workers: int = 256,
    short_receive: str = "generous",
    backoff: str = "exponential",
    retry_info: str = "always",
    deliver_time: str = "kept",
) -> tuple[Any, Front]:
    """Start the front on ``host_port`` (``"127.0.0.1:0"`` picks a port); return
    (server, front). ``server.bound_port`` is the port; ``short_receive`` answers very short
    RECEIVE calls (``receiving.SHORT_RECEIVE_MODES``); ``backoff`` and ``retry_info`` choose
    the other open answers (``answers``); ``deliver_time`` says what a lease does to
    ``DeliverTime`` (``queues.DELIVER_TIME_MODES``). The port is the front's alone
    (``SO_REUSEPORT`` off): a port another server holds raises ``AddressInUse``, where gRPC's
    default would share it and split clients at random between two databases."""
    front = Front(
        backend_address,
        short_receive=short_receive,
        backoff=backoff,
        retry_info=retry_info,
        deliver_time=deliver_time,
    )

    class Handler(grpc.GenericRpcHandler):
        def service(self, details: Any) -> grpc.RpcMethodHandler:
            return front.handler(details.method)

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sq-front"),
        options=[
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),
        ],
    )
    server.add_generic_rpc_handlers((Handler(),))
    try:
        port = server.add_insecure_port(host_port)
    except RuntimeError as exc:  # grpcio >= 1.50 raises; older ones return 0
        port, cause = 0, f" ({exc})"
    else:
        cause = ""
    if not port:
        server.stop(None)
        front.channel.close()
        raise AddressInUse(
            f"the emulator front cannot listen on {host_port}: the port is in use (another "
            f"front or server?) or the address is not this machine's{cause}"
        )
    # the port it got (host_port may ask for 0); grpc.Server has no attribute for it
    server.bound_port = port  # type: ignore[attr-defined]
    server.start()
    return server, front

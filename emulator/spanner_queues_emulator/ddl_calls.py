"""The front's schema calls: queue DDL translated to table DDL (``schema``), the catalog of
queues per database read back from the emulator's DDL, and what was declared (``CREATE QUEUE``
text and ``ALTER QUEUE`` options, kept in memory) so that ``GetDatabaseDdl`` shows queues as
declared."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.cloud.spanner_admin_database_v1.types import spanner_database_admin as admin_types
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2

from spanner_queues_emulator import backend as b
from spanner_queues_emulator import queues as q
from spanner_queues_emulator import schema as s

UpdateDatabaseDdlRequest = admin_types.UpdateDatabaseDdlRequest.pb()
CreateDatabaseRequest = admin_types.CreateDatabaseRequest.pb()
DropDatabaseRequest = admin_types.DropDatabaseRequest.pb()
UpdateDatabaseDdlMetadata = admin_types.UpdateDatabaseDdlMetadata.pb()
Operation = operations_pb2.Operation


@dataclass(frozen=True, slots=True)
class Declared:
    """A queue statement's effect on what ``GetDatabaseDdl`` shows: ``queue`` declared (None:
    dropped) under ``name``, once the first ``needs`` emulator statements have applied."""

    needs: int
    name: str
    queue: s.QueueSchema | None


def _applied(response: bytes, count: int) -> int:
    """How many of the ``count`` statements an ``UpdateDatabaseDdl`` operation applied: all
    unless it ended with an error, then those with a commit timestamp in its metadata."""
    operation = Operation.FromString(response)
    if not operation.HasField("error"):
        return count
    metadata = UpdateDatabaseDdlMetadata()
    if operation.metadata.Unpack(metadata):
        return len(metadata.commit_timestamps)
    return 0


class SchemaCalls:
    """``UpdateDatabaseDdl``, ``CreateDatabase``, ``GetDatabaseDdl`` and ``DropDatabase`` of
    the front, and the catalog of queues the other calls look up."""

    def __init__(self, backend: b.Backend, forward: Callable[[str, bytes, Any], bytes]) -> None:
        self.backend = backend
        self._forward = forward
        self._catalogs: dict[str, dict[str, s.QueueSchema]] = {}
        #: what this front saw declared (CREATE QUEUE text, OPTIONS), by database and queue.
        self._declared: dict[str, dict[str, s.QueueSchema]] = collections.defaultdict(dict)
        self._lock = threading.Lock()

    def catalog(self, database: str) -> dict[str, s.QueueSchema]:
        with self._lock:
            known = self._catalogs.get(database)
        if known is None:
            known = s.catalog_from_ddl(self.backend.database_ddl(database))
            with self._lock:
                self._catalogs[database] = known
        return known

    def forget(self, database: str) -> None:
        with self._lock:
            self._catalogs.pop(database, None)

    def translate_ddl(
        self, database: str, statements: list[str]
    ) -> tuple[list[str], list[Declared]]:
        """The emulator's statements for ``statements``, and what each queue statement
        declares: ``Declared`` changes, kept only once the emulator has applied the
        statements they wait for (``keep_declared``)."""
        out: list[str] = []
        changes: list[Declared] = []
        seen = dict(self._declared.get(database, {}))  # as if the statements so far applied

        def change(name: str, queue: s.QueueSchema | None) -> None:
            changes.append(Declared(len(out), name.upper(), queue))
            if queue is None:
                seen.pop(name.upper(), None)
            else:
                seen[name.upper()] = queue

        for statement in statements:
            if not s.is_queue_statement(statement):
                out.append(statement)
                continue
            text = s.strip_comments(statement).lstrip().upper()
            if text.startswith("CREATE"):
                queue, table = s.parse_create_queue(statement)
                out.append(table)
                change(queue.name, queue)
            elif text.startswith("DROP"):
                name, table = s.parse_drop_queue(statement)
                out.append(table)
                change(name, None)
            else:
                name, table_stmt, options = s.parse_alter_queue(statement)
                if table_stmt is not None:
                    out.append(table_stmt)
                if options is not None:
                    base = seen.get(name.upper()) or self.catalog(database).get(name.upper())
                    if base is None:
                        raise q.QueueRefusal("NOT_FOUND", f"Queue not found: {name}")
                    kept = s.QueueSchema(
                        base.name,
                        base.keys,
                        base.key_types,
                        base.payload_type,
                        declared=None,
                        options=options,
                    )
                    change(name, kept)
        return out, changes

    def keep_declared(self, database: str, changes: list[Declared], applied: int) -> None:
        """Keep the changes whose statements are among the first ``applied`` the emulator
        ran (a refused statement, and every one after it, declares nothing)."""
        with self._lock:
            declared = self._declared[database]
            for change in changes:
                if change.needs > applied:
                    break
                if change.queue is None:
                    declared.pop(change.name, None)
                else:
                    declared[change.name] = change.queue

    def update_ddl(self, request: bytes, context: Any) -> bytes:
        req = UpdateDatabaseDdlRequest.FromString(request)
        if not any(s.is_queue_statement(x) for x in req.statements):
            response = self._forward(b.ADMIN + "UpdateDatabaseDdl", request, context)
            self.forget(req.database)
            return response
        translated, changes = self.translate_ddl(req.database, list(req.statements))
        self.forget(req.database)
        if not translated:  # only ALTER QUEUE ... SET OPTIONS: nothing for the emulator
            self.keep_declared(req.database, changes, 0)
            done = Operation(
                name=f"{req.database}/operations/front{int(time.time() * 1e6)}", done=True
            )
            done.response.Pack(empty_pb2.Empty())
            return done.SerializeToString()
        del req.statements[:]
        req.statements.extend(translated)
        try:
            response = self._forward(
                b.ADMIN + "UpdateDatabaseDdl", req.SerializeToString(), context
            )
        finally:
            self.forget(req.database)
        self.keep_declared(req.database, changes, _applied(response, len(translated)))
        return response

    def create_database(self, request: bytes, context: Any) -> bytes:
        req = CreateDatabaseRequest.FromString(request)
        if not any(s.is_queue_statement(x) for x in req.extra_statements):
            return self._forward(b.ADMIN + "CreateDatabase", request, context)
        name = s.unquote(req.create_statement.split()[-1])
        database = f"{req.parent}/databases/{name}"
        translated, changes = self.translate_ddl(database, list(req.extra_statements))
        del req.extra_statements[:]
        req.extra_statements.extend(translated)
        response = self._forward(b.ADMIN + "CreateDatabase", req.SerializeToString(), context)
        operation = Operation.FromString(response)
        if not operation.HasField("error"):  # a database is created whole or not at all
            with self._lock:
                self._declared.pop(database, None)
            self.keep_declared(database, changes, len(translated))
        return response

    def get_ddl(self, request: bytes, context: Any) -> bytes:
        response = b.GetDatabaseDdlResponse.FromString(
            self._forward(b.ADMIN + "GetDatabaseDdl", request, context)
        )
        database = b.GetDatabaseDdlRequest.FromString(request).database
        shown = list(s.present_ddl(response.statements, self._declared.get(database, {})))
        del response.statements[:]
        response.statements.extend(shown)
        return response.SerializeToString()

    def drop_database(self, request: bytes, context: Any) -> bytes:
        database = DropDatabaseRequest.FromString(request).database
        response = self._forward(b.ADMIN + "DropDatabase", request, context)
        self.forget(database)
        self._declared.pop(database, None)
        self.backend.forget(database)
        return response

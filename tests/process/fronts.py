"""A queue-aware front (with its own emulator) of a test's own, on a fixed loopback port, for
``runqueueworker`` children whose Spanner is stopped, restarted or unreachable while they run.

The session's front (``SPANNER_EMULATOR_HOST``) stays untouched: the private one gets a copy of
the test database's schema (``GetDatabaseDdl``), under the same instance name, and is started
again on the same port with the same schema (a fresh database: every session is gone).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from spanner_queues_emulator.process import free_port, terminate

_names = itertools.count()


@contextlib.contextmanager
def _emulator_host(host: str) -> Iterator[None]:
    """``SPANNER_EMULATOR_HOST`` is read when a ``spanner.Client`` is made: point it at
    ``host`` for that moment only (the test's Django connections keep the session's front)."""
    before = os.environ.get("SPANNER_EMULATOR_HOST")
    os.environ["SPANNER_EMULATOR_HOST"] = host
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SPANNER_EMULATOR_HOST", None)
        else:
            os.environ["SPANNER_EMULATOR_HOST"] = before


class PrivateFront:
    """An emulator behind the queue-aware front on ``host`` (a fixed port), holding database
    ``name`` with ``ddl`` in instance ``instance``."""

    def __init__(self, instance: str, ddl: list[str]) -> None:
        self.instance = instance
        self.ddl = ddl
        self.host = f"127.0.0.1:{free_port()}"
        self.name = f"pf{os.getpid()}x{next(_names)}"
        self._process: subprocess.Popen[bytes] | None = None
        self.database: Any = None

    def start(self) -> PrivateFront:
        """Start (again, on the same port): a new emulator, instance and database."""
        from google.api_core.exceptions import AlreadyExists
        from google.cloud import spanner

        # A process of its own (``python -m spanner_queues_emulator``), started without a
        # ``preexec_fn``: forking this many-threaded (gRPC) process to run Python code in the
        # child now and then aborted it.
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spanner_queues_emulator",
                "--host-port",
                self.host,
                "--exit-with-parent",
            ],
            stdout=subprocess.PIPE,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline().decode()
        if not line.startswith(f"ready {self.host}"):
            self.stop()
            raise RuntimeError(f"the private front did not start: {line!r}")
        with _emulator_host(self.host):
            client = spanner.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "test-project"))
        instance = client.instance(
            self.instance,
            configuration_name=f"{client.project_name}/instanceConfigs/emulator-config",
            node_count=1,
        )
        with contextlib.suppress(AlreadyExists):
            instance.create().result(60)
        self.database = instance.database(self.name, ddl_statements=self.ddl)
        self.database.create().result(120)
        return self

    def burn_session_names(self, count: int = 300) -> None:
        """Create (and forget) ``count`` sessions: the emulator numbers sessions 1, 2, 3...
        per process, so a client's session names would soon exist again on a restarted
        emulator, which real Spanner never does. After this, sessions made before a restart
        keep names the restarted emulator does not reach in a test."""
        api = self.database.spanner_api
        left = count
        while left > 0:
            made = api.batch_create_sessions(
                database=self.database.name, session_count=min(left, 100)
            )
            left -= len(made.session)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            terminate(process, timeout=30)

    def child_env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` for a child whose Spanner is this front's database."""
        return {**env, "SPANNER_EMULATOR_HOST": self.host, "SQ_DATABASE_NAME": self.name}

    def rows(self, sql: str) -> list[list[Any]]:
        with self.database.snapshot() as snapshot:
            return [list(row) for row in snapshot.execute_sql(sql)]

    def send(self, queue: str, keys: list[tuple[Any, ...]], payload: str | bytes) -> None:
        """``Send`` mutations, one per key, in one batch."""
        with self.database.batch() as batch:
            for key in keys:
                batch.send(queue=queue, key=list(key), payload=payload)


def ddl_of_test_database() -> list[str]:
    """The schema of the test's own database (on the session's front)."""
    from spanner_queues.engines.native.client import database_for

    database = database_for("default")
    database.reload()
    return list(database.ddl_statements)

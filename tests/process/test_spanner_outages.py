"""A native worker when Spanner goes away: ``runqueueworker`` children on a front of the test's
own (``tests.process.fronts``), which is stopped (Spanner unreachable) or restarted on the same
port (every session gone, as real Spanner deletes idle sessions and drops them on a backend
restart). Only where the default engine runs native queues on the queue-aware front."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings

from spanner_queues.engines import engines
from spanner_queues.engines.native import client
from tests.children import TIMEOUT, Child
from tests.conftest import wait_until
from tests.process.fronts import PrivateFront, ddl_of_test_database
from tests.workerapp.models import Tasks, WorkItems

pytestmark = [
    pytest.mark.process,
    pytest.mark.django_db(transaction=True),
    pytest.mark.requires("supports_native_queues"),
    pytest.mark.skipif(
        os.environ.get("DJANGO_SETTINGS_MODULE") != "tests.settings_spanner_native",
        reason="needs the queue-aware front (its own, restarted under the worker)",
    ),
]

#: seconds a worker whose Spanner is unreachable may take to stop after SIGTERM (the RECEIVE
#: stream's stop waits up to 5 s; nothing else waits on Spanner)
STOP_BOUND = 30


@pytest.fixture
def front(transactional_db: None) -> Iterator[PrivateFront]:
    started = PrivateFront(settings.INSTANCE, ddl_of_test_database()).start()
    yield started
    started.stop()


def _summaries(child: Child) -> int:
    return child.output().count("processed=")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_query_to_an_unreachable_spanner_makes_a_few_attempts_and_gives_up(
    front: PrivateFront,
) -> None:
    assert client.query(front.database, "SELECT 1") == [[1]]  # (its session exists)
    front.stop()
    before = client.retried_attempts
    with pytest.raises(Exception) as raised:
        client.query(front.database, "SELECT 1", deadline=3.0)
    attempts = client.retried_attempts - before
    # back-off 0.1 s doubling to 2 s within 3 s: a handful of attempts, not a spin
    assert 1 <= attempts <= 10, attempts
    assert "Unavailable" in type(raised.value).__name__ or "Retry" in type(raised.value).__name__


def test_a_cursor_read_of_an_unreachable_spanner_gives_up_after_its_deadline(
    front: PrivateFront,
) -> None:
    """The client's ``Snapshot.execute_sql`` (every query of the Django cursor) calls
    ``ExecuteStreamingSql`` again at once after each UNAVAILABLE, for ever; the Django
    connections of native databases get ``client.bound_streaming_reads``."""
    from django.db import connection
    from google.api_core.exceptions import DeadlineExceeded

    connection.ensure_connection()
    assert isinstance(connection.connection.database.spanner_api, client._BoundedStreamingReads)
    database = client.bound_streaming_reads(front.database, deadline=2.0)
    with database.snapshot() as snapshot:
        assert [list(row) for row in snapshot.execute_sql("SELECT 1")] == [[1]]
    front.stop()
    inner = database.spanner_api._api
    real, calls, raised = inner.execute_streaming_sql, [], []

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kwargs)

    inner.execute_streaming_sql = counted

    def read() -> None:
        try:
            with database.snapshot() as snapshot:
                list(snapshot.execute_sql("SELECT 1"))
        except Exception as exc:
            raised.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), f"still retrying after {len(calls)} calls"
    assert raised and isinstance(raised[0], DeadlineExceeded), raised
    assert 2 <= len(calls) <= 15, len(calls)  # back-off 0.1 s doubling to 2 s, for 2 s


def test_sigterm_stops_a_worker_whose_spanner_is_unreachable(
    front: PrivateFront, child_env: dict[str, str], tmp_path: Path
) -> None:
    child = Child(
        front.child_env(child_env),
        tmp_path,
        "workerapp.WorkItems",
        "-v1",
        "--summary-interval",
        "0.2",
    )
    try:
        wait_until(lambda: "depth: workerapp.WorkItems=0" in child.output(), timeout=TIMEOUT)
        front.stop()  # Spanner unreachable from here on
        # The summary lines go on (no stats read on the intake thread), the stats show the
        # outage, and the process does not spin while it lasts.
        wait_until(lambda: "WorkItems=? (" in child.output(), timeout=TIMEOUT)
        seen, cpu, at = _summaries(child), _cpu_seconds(child.proc.pid), time.monotonic()
        wait_until(lambda: _summaries(child) >= seen + 25, timeout=TIMEOUT)
        busy = (_cpu_seconds(child.proc.pid) - cpu) / (time.monotonic() - at)
        print(f"CPU while Spanner was unreachable: {busy:.0%} of one core")
        signalled = time.monotonic()
        child.proc.send_signal(signal.SIGTERM)
        assert child.proc.wait(STOP_BOUND) == 0, child.output()
        print(f"stopped {time.monotonic() - signalled:.1f} s after SIGTERM")
        assert "stopping" in child.output()
    finally:
        child.kill()


@pytest.mark.parametrize(
    "model, key",
    [
        # with max_attempts: the worker also reads the failure ledger through the Django cursor
        (WorkItems, lambda name: (name,)),
        # without: RECEIVE is the only read of the receive loop
        (Tasks, lambda name: ("email", name)),
    ],
    ids=["with-failure-ledger", "receive-only"],
)
def test_a_worker_recovers_when_spanner_lost_its_sessions(
    front: PrivateFront,
    child_env: dict[str, str],
    tmp_path: Path,
    model: type,
    key: Callable[[str], tuple[str, ...]],
) -> None:
    decl = engines["default"].declaration(model)
    payload = client.wire_payload(decl.payload_type, b"{}" if model is WorkItems else b"")

    front.burn_session_names()  # (as on real Spanner, no name comes back after the restart)

    def logged() -> set[str]:
        return {row[0] for row in front.rows("SELECT `key` FROM workerapp_worklog")}

    child = Child(
        front.child_env(child_env),
        tmp_path,
        model._meta.label,
        "-v1",
        "--summary-interval",
        "1",
    )
    try:
        front.send(decl.name, [key("before")], payload)
        wait_until(lambda: "before" in logged(), timeout=TIMEOUT)
        front.stop()
        restarted_at = len(child.output())
        front.start()  # the same port, a new emulator: every session the worker had is gone
        front.send(decl.name, [key("after1"), key("after2")], payload)
        wait_until(lambda: {"after1", "after2"} <= logged(), timeout=TIMEOUT)
        # ... and no receiver run failed for it: its transaction found the session lost,
        # closed the connection and ran again on a new one. (Without that, every run failed
        # with "Session not found", for good.)
        after_restart = child.output()[restarted_at:]
        assert "attempt 1 failed" not in after_restart, after_restart
        assert "failure failed" not in after_restart, after_restart
        assert "lost (404 Session not found" in after_restart  # (the path it took)
        child.proc.send_signal(signal.SIGTERM)
        assert child.proc.wait(STOP_BOUND) == 0, child.output()
    finally:
        child.kill()

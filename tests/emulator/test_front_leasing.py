"""What a process's receiving leases on the queue-aware front, measured on the front's own
bookkeeping (the hidden lease column of the queue's table): leasing is bounded by demand, and a
plain ``api.receive()`` outside a worker holds no stream and no row once it has returned."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from django.db import connection

from spanner_queues import api
from spanner_queues.engines import engines, native
from spanner_queues.engines.spanner_ddl import duration
from spanner_queues.semantics import LEASE
from spanner_queues_emulator.schema import LEASE_EXPIRES
from tests.conftest import wait_until
from tests.testapp.models import Jobs

pytestmark = pytest.mark.django_db(transaction=True)

PAYLOAD = "x" * 4096


def leased_keys(model: Any = Jobs) -> set[str]:
    """Keys of ``model``'s queue whose lease has not ended, as the front recorded it."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {model._meta.db_table} WHERE {LEASE_EXPIRES} > CURRENT_TIMESTAMP()"
        )
        return {key for (key,) in cursor.fetchall()}


def leased_rows(model: Any = Jobs) -> int:
    return len(leased_keys(model))


def send(n: int) -> None:
    for start in range(0, n, 100):
        Jobs.send_many([{"payload": PAYLOAD} for _ in range(min(100, n - start))])


def receiver() -> Any:
    with native._streams_lock:
        return native._streams.get((engines["default"].alias, Jobs._meta.label))


def test_receive_of_one_leases_no_more_than_demand_plus_one_batch() -> None:
    send(300)
    try:
        [_taken] = wait_until(lambda: api.receive(Jobs, max_messages=1), timeout=60)
        # Leased and not started: everything leased but the one message handed out. The
        # stream must end its call at the demand, not read (and lease) ahead.
        stream = receiver()
        assert stream is not None
        wait_until(lambda: not stream.calling, timeout=30)
        unstarted = leased_rows() - 1
        batch = 1  # RECEIVE's max_batch_size is the demand
        assert unstarted <= 1 + batch, f"{unstarted} of 299 leased and never handed out"
    finally:
        api.stop_receiving(Jobs, wait=10)


def test_a_plain_receive_holds_no_stream_and_renews_no_row_after_it_returns() -> None:
    send(3)
    try:
        [message] = wait_until(lambda: api.receive(Jobs), timeout=60)
        stream = receiver()
        # No call stays open once the receive has returned (only briefly)...
        wait_until(lambda: not stream.calling, timeout=30)
        # ...and a row the stream holds for nobody is not renewed: within about a lease every
        # row but the one handed out is due again (the front's clock, its lease of 10 s).
        assert wait_until(lambda: leased_keys() <= {message.key[0]}, timeout=LEASE.seconds + 15)
        assert not stream.calling
    finally:
        api.stop_receiving(Jobs, wait=10)


def test_a_plain_receive_that_found_nothing_leaves_no_call_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = engines["default"]
    # A call that would stay open ten minutes unless the receiver ends it.
    monkeypatch.setattr(engine, "max_duration_seconds", 600.0)
    monkeypatch.setattr(engine, "max_duration", duration(600.0))
    try:
        assert api.receive(Jobs) == []
        stream = receiver()
        assert wait_until(lambda: not stream.calling, timeout=30)
        Jobs.send(payload="later")  # nobody is receiving: nothing leases it
        assert leased_rows() == 0
        assert wait_until(lambda: api.receive(Jobs), timeout=30)  # a new call for a new demand
    finally:
        api.stop_receiving(Jobs, wait=10)


def test_another_process_drains_all_but_what_a_plain_receive_took(
    child_env: dict[str, str],
) -> None:
    sent = Jobs.send_many([{"payload": str(i)} for i in range(5)])
    try:
        [taken] = wait_until(lambda: api.receive(Jobs), timeout=60)  # kept, never renewed
        child = subprocess.run(
            [
                sys.executable,
                "-m",
                "spanner_queues.testing.conformance.claimer",
                "testapp.Jobs",
                "60",
            ],
            env=child_env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert child.returncode == 0, child.stderr
        drained = {tuple(json.loads(line)["key"]) for line in child.stdout.splitlines()}
        assert drained | {taken.key} == {m.key for m in sent}
    finally:
        api.stop_receiving(Jobs, wait=10)

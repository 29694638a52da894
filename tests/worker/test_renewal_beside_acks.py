"""A delivery's ack and its lease renewal never spoil each other: no renewal rotates a token an
ack has read, a renewal waiting for the write lock neither blocks nor outwaits the ack, an
atomic receiver outliving the lock timeout keeps its work, a replace during a delivery survives
its ack, and a receiver that acks its own message is not acked again."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from spanner_queues.drivers import driver_for
from spanner_queues.engines import engine_for
from spanner_queues.worker import Worker, WorkerEvents
from tests.conftest import wait_until
from tests.worker.conftest import require, running
from tests.workerapp.models import WorkItems, WorkLog

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_replace_during_a_delivery_is_not_lost_to_that_deliverys_ack(
    make_worker: Callable[..., Worker], events: Any, tmp_path: Path
) -> None:
    """The producer replaces a message while a worker runs the old one: the worker's ack used
    to delete the new message (ack by key), so the new payload was never handled."""
    from spanner_queues import api
    from spanner_queues.engines import engines
    from tests.conftest import wait_until
    from tests.worker.conftest import running

    if not engines["default"].features.supports_lease_checked_ack:
        pytest.skip("the engine acks by key alone (native Spanner)")
    go, trace = tmp_path / "go", tmp_path / "trace"
    WorkItems.send(id="k", payload={"mode": "external", "block": str(go), "trace": str(trace)})
    with running(make_worker(WorkItems, concurrency=1)):
        wait_until(trace.exists)  # the old message is in its receiver
        api.replace(WorkItems, {"id": "k"}, payload={"mode": "external", "note": "new"})
        go.touch()
        assert events.wait_for("lease_lost")  # the stale ack was refused...
        assert events.wait_for("acked")  # ...and the new message was delivered and acked
    assert not WorkItems.objects.exists()
    assert WorkLog.objects.filter(key="k").count() == 2


@pytest.mark.requires("stores_bookkeeping_fields")  # reads the lease_token column
def test_no_renewal_rotates_a_lease_token_once_an_ack_has_read_it(
    make_worker: Callable[..., Worker],
) -> None:
    """Acks carry the lease token; a renewal that rotated it between the ack reading it and
    the DELETE made the ack stale (a spurious lease_lost, and on Spanner a replayed ack
    transaction that committed the receiver's work without its DELETE: a message left
    behind). Once an ack has read a delivery's token, the renewer leaves that delivery alone."""
    require("supports_lease_renewal")
    WorkItems.send(id="r", payload={})
    worker = make_worker(WorkItems)
    assert worker.intake.fill(worker.plans[0], 1) == 1
    [delivery] = list(worker.slots.deliveries)
    token = delivery.message.lease_token
    [frozen] = worker.leases.freeze([delivery])
    assert frozen.lease_token == token
    worker.renewer.renew([delivery])  # what the renewer thread would do now
    assert WorkItems.objects.get(pk="r").lease_token == token
    from spanner_queues import api

    api.ack(frozen)
    assert not WorkItems.objects.filter(pk="r").exists()


@pytest.mark.requires("stores_bookkeeping_fields")  # renewal through a table transaction
def test_a_renewal_waiting_for_the_write_lock_does_not_block_the_ack_holding_it(
    make_worker: Callable[..., Worker],
    events: WorkerEvents,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An atomic receiver's transaction holds the database's write lock (SQLite: one per file)
    until its ack commits, and the ack reads the lease under the worker's renewal lock. The
    renewer took the renewal lock first and then waited for the write lock: each waited for
    the other (until the lock and busy timeouts, again on every retry), and on SQLite every
    worker process on the database stalled with it (the SIGKILL storm's "due message never
    received"). Here the renewer comes for the write lock while the receiver runs; the ack must
    not wait for it."""
    require("supports_lease_renewal")
    go = tmp_path / "go"
    WorkItems.send(id="held", payload={"block": str(go)})
    driver = type(driver_for(engine_for(WorkItems).database))
    write_lock = driver.write_lock
    renewer_waits: list[str] = []

    def recorded(self: Any, timeout: float | None = None) -> Any:
        if threading.current_thread().name == "sq-renewer":
            renewer_waits.append("write_lock")
        return write_lock(self, timeout)

    monkeypatch.setattr(driver, "write_lock", recorded)
    with running(make_worker(WorkItems, lease=timedelta(seconds=2))):
        assert events.wait_for("started")  # the receiver runs in its transaction, blocked
        before = len(renewer_waits)
        wait_until(lambda: len(renewer_waits) > before)  # a renewal comes for the write lock
        go.touch()
        # Well inside the lock timeouts (tests.settings: 20 s) that alone ended the deadlock.
        assert events.wait_for("acked", timeout=15)
    assert list(WorkLog.objects.values_list("key", flat=True)) == ["held"]
    assert not WorkItems.objects.exists()


@pytest.mark.requires("stores_bookkeeping_fields")  # renewal through a table transaction
def test_an_atomic_receiver_that_outlives_the_write_lock_timeout_keeps_its_work(
    make_worker: Callable[..., Worker],
    events: WorkerEvents,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On SQLite an atomic receiver holds the database's write lock until its ack commits, so
    no renewal can be written meanwhile (and nobody can claim its message either). The renewer
    waited for the write lock for the connection's lock timeout, then went on without it and
    waited in SQLite's busy handler, on every transaction retry, while holding the renewal
    lock that the finished receiver needed to ack: the ack (and every other ack of the
    process) waited for all those retries, about 25 s here, and the renewal failed with
    "database is locked". Here the lock timeout is 0.5 s and the receiver runs for 2.5 s: the
    renewer must wait its turn instead, and no renewal fails."""
    require("supports_lease_renewal")
    _short_lock_timeout(monkeypatch)
    WorkItems.send(id="long", payload={"pause": 2.5})
    with running(make_worker(WorkItems, lease=timedelta(seconds=0.4), max_messages=1)):
        assert events.wait_for("acked", timeout=30) or events.wait_for("lease_lost", timeout=1)
    assert events.counts["acked"] == 1 and events.counts["lease_lost"] == 0
    assert events.counts["renewal_failed"] == 0
    assert list(WorkLog.objects.values_list("key", "attempt")) == [("long", 1)]
    assert not WorkItems.objects.exists()


@pytest.mark.requires("stores_bookkeeping_fields")  # renewal through a table transaction
def test_a_renewal_never_waits_for_the_database_holding_what_an_ack_needs(
    make_worker: Callable[..., Worker],
    events: WorkerEvents,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A receiver that is not atomic acks in a transaction of its own (``atomic()`` then
    ``api.ack``): that transaction holds SQLite's write lock without the worker's, and its ack
    reads the renewed lease under the renewal lock. The renewer took the renewal lock and then
    waited for SQLite's lock in ``BEGIN IMMEDIATE`` (on every retry): the ack waited for all
    of them and the renewal failed. The renewal lock is taken only inside the renewal's
    transaction now, once the database's lock is had, as an ack takes it."""
    require("supports_lease_renewal")
    _short_lock_timeout(monkeypatch)
    WorkItems.send(id="own", payload={"mode": "external", "own_transaction": True, "pause": 1.5})
    with running(make_worker(WorkItems, lease=timedelta(seconds=0.4), max_messages=1)):
        assert events.wait_for("acked", timeout=60)
    assert events.counts["renewal_failed"] == 0 and events.counts["lease_lost"] == 0
    assert list(WorkLog.objects.values_list("key", flat=True)) == ["own"]
    assert not WorkItems.objects.exists()


def test_a_receiver_that_acks_its_own_message_is_not_acked_again(
    make_worker: Callable[..., Worker], events: WorkerEvents
) -> None:
    """``api.ack(message)`` in an atomic receiver's code (what the worker would do after it):
    the worker then acked it a second time, found no row, and rolled the whole transaction
    back - the receiver's work and its own ack - so the message came back, every time."""
    WorkItems.send(id="self", payload={"ack_itself": True})
    with running(make_worker(WorkItems, max_messages=1)):
        assert events.wait_for("acked", timeout=30) or events.wait_for("already_acked", 1)
    assert events.counts["acked"] == 1 and events.counts["already_acked"] == 0
    assert list(WorkLog.objects.values_list("key", flat=True)) == ["self"]
    assert not WorkItems.objects.exists()


def _short_lock_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections opened from now on wait 0.5 s for SQLite's locks (its busy timeout, also
    the wait for the process's write lock); other databases have no such option."""
    options = connections.settings[engine_for(WorkItems).database].get("OPTIONS", {})
    if "timeout" in options:
        monkeypatch.setitem(options, "timeout", 0.5)

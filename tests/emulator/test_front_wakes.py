"""Which commits wake an idle RECEIVE on the front, counted at the front's own looks at a queue
(``queues.has_due``, one strong read of the emulator each: Google's emulator serves every read
a little slower for each call it has served, ``benchmarks/emulator_aging.py``).

A front of their own, in this process (``QueueEmulator``), so the looks can be counted, with
its idle poll at a minute: whatever a stream sees within a test came from a wake.
"""

from __future__ import annotations

import base64
import collections
import itertools
import os
import queue as queue_module
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import wait_until

from .conftest import IN_PROCESS, Q1, SAMPLE_QUEUE, USERS

_names = itertools.count()
RECEIVE_Q1 = "SELECT Id FROM RECEIVE_Q1(max_batch_size => 1, max_duration => '30s')"


@pytest.fixture(scope="module")
def front(in_process_front: Any) -> Any:
    return in_process_front


@pytest.fixture
def looks(front: Any, monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """The front's looks at each queue from now on (its idle poll a minute)."""
    from spanner_queues_emulator import queues, receiving

    monkeypatch.setattr(receiving, "IDLE_POLL_SECONDS", 60.0)
    counts: collections.Counter[str] = collections.Counter()
    real = queues.has_due

    def counted(backend: Any, database: str, queue: Any) -> Any:
        counts[queue.name] += 1
        return real(backend, database, queue)

    monkeypatch.setattr(queues, "has_due", counted)
    return counts


@pytest.fixture
def database(front: Any) -> Iterator[Any]:
    from google.cloud import spanner

    client = spanner.Client(project="test-project")
    db = client.instance(IN_PROCESS).database(
        f"wk{os.getpid()}x{next(_names)}", ddl_statements=[USERS, Q1, SAMPLE_QUEUE]
    )
    db.create().result(60)
    yield db
    db.drop()


def idle_receive(database: Any, looks: collections.Counter[str]) -> queue_module.Queue:
    """A RECEIVE of Q1 in a thread, returned once it has looked at its empty queue and waits;
    its rows arrive on the queue returned."""
    rows: queue_module.Queue = queue_module.Queue()

    def run() -> None:
        try:
            with database.snapshot() as snap:
                for row in snap.execute_sql(RECEIVE_Q1):
                    rows.put(row)
        except Exception:  # the test's database dropped under the stream: it is over
            pass

    threading.Thread(target=run, daemon=True).start()
    wait_until(lambda: looks["Q1"] >= 1, timeout=30)
    return rows


def insert(t: Any, table: str, key: int) -> None:
    if table == "Users":
        t.execute_update(f"INSERT INTO Users (UserId, Name) VALUES ({key}, 'ada')")
    elif table == "SampleQueue":  # Payload STRING(MAX)
        t.execute_update(f"INSERT INTO SampleQueue (Id, Payload) VALUES ({key}, 'x')")
    else:
        t.execute_update(f"INSERT INTO {table} (Id, Payload) VALUES ({key}, b'x')")


def test_commits_that_send_nothing_to_a_queue_wake_none_of_its_streams(
    database: Any, looks: collections.Counter[str]
) -> None:
    """Sends to another queue, writes to a table and acks make nothing of Q1 due: its idle
    stream does not look again (it looked after every commit through the front before)."""
    rows = idle_receive(database, looks)
    before = looks["Q1"]
    for n in range(5):
        database.run_in_transaction(insert, "SampleQueue", n)
        database.run_in_transaction(insert, "Users", n)
        with database.batch() as batch:
            batch.send(queue="SampleQueue", key=(100 + n,), payload="x")
        database.run_in_transaction(
            lambda t, n=n: t.execute_update(
                f"DELETE FROM SampleQueue WHERE Id = {n} ASSERT_ROWS_MODIFIED 1"
            )
        )
    assert looks["Q1"] == before
    assert looks["SampleQueue"] == 0  # no stream of its own: no look
    assert rows.empty()


def _dml_inline(database: Any) -> None:
    database.run_in_transaction(insert, "Q1", 1)


def _dml_begun(database: Any) -> None:
    session = database.session()
    session.create()
    try:
        transaction = session.transaction()
        transaction.begin()  # BeginTransaction: the statement names the transaction by id
        insert(transaction, "Q1", 1)
        transaction.commit()
    finally:
        session.delete()


def _batch_dml(database: Any) -> None:
    database.run_in_transaction(
        lambda t: t.batch_update(["INSERT INTO Q1 (Id, Payload) VALUES (1, b'x')"])
    )


def _send_mutation(database: Any) -> None:
    with database.batch() as batch:
        batch.send(queue="Q1", key=(1,), payload=base64.b64encode(b"x"))


@pytest.mark.parametrize(
    "send",
    [_dml_inline, _dml_begun, _batch_dml, _send_mutation],
    ids=["insert-begun-inline", "insert-after-begin", "batch-dml", "send-mutation"],
)
def test_a_send_wakes_its_queues_idle_stream_at_once(
    database: Any, looks: collections.Counter[str], send: Any
) -> None:
    rows = idle_receive(database, looks)
    send(database)
    assert rows.get(timeout=15) == [1]


def test_a_send_between_a_look_and_the_wait_after_it_is_not_missed(
    front: Any, database: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A send that commits while the stream looks (after its look read the queue empty, before
    it waits) wakes it: the wait compares the queue's count of sends, not notifications."""
    from spanner_queues_emulator import queues, receiving

    monkeypatch.setattr(receiving, "IDLE_POLL_SECONDS", 60.0)
    real = queues.has_due
    sent = threading.Event()

    def look_then_send(backend: Any, db: str, queue: Any) -> Any:
        found = real(backend, db, queue)
        if queue.name == "Q1" and not sent.is_set():
            sent.set()
            _dml_inline(database)  # commits through the front, from another thread of it
        return found

    monkeypatch.setattr(queues, "has_due", look_then_send)
    began = time.monotonic()
    with database.snapshot() as snap:
        rows = snap.execute_sql(
            "SELECT Id FROM RECEIVE_Q1(max_batch_size => 1, max_duration => '20s')"
        )
        first = next(iter(rows), None)  # the first row, not the call's end
    assert first == [1]
    assert time.monotonic() - began < 15  # (without the wake: the whole 20 s, and no row)
    assert sent.is_set()

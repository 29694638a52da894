"""The front's own read-write transactions on the emulator behind it (claims, renewals, checked
blind commits), counted at the front's calls to the emulator: each is begun by its first read
(no ``BeginTransaction``) and they run one at a time, so two of them never abort each other
(the emulator runs one read-write transaction at a time and aborts the newcomer four times in
five). Under a soak beside ``bin/test``, RECEIVE streams claiming at once made 162 aborted
claims in two minutes, each a begin, a read and a rollback of the emulator (a quarter of it).

A front of its own, in this process (``QueueEmulator``), so its calls can be counted.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import IN_PROCESS, Q1, USERS

_names = itertools.count()


@pytest.fixture(scope="module")
def front(in_process_front: Any) -> Any:
    return in_process_front


@pytest.fixture
def calls(front: Any, monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """The front's own calls to the emulator from now on, by method."""
    backend = front._front.backend
    counts: collections.Counter[str] = collections.Counter()
    for attribute, method in [
        ("_begin", "BeginTransaction"),  # (the front had one before)
        ("_execute", "ExecuteSql"),
        ("_read", "Read"),
        ("_commit", "Commit"),
        ("_rollback", "Rollback"),
    ]:
        real = getattr(backend, attribute, None)
        if real is None:
            continue

        def counted(*args: Any, _real: Any = real, _method: str = method, **kw: Any) -> Any:
            counts[_method] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(backend, attribute, counted)
    return counts


@pytest.fixture
def database(front: Any) -> Iterator[Any]:
    from google.cloud import spanner

    client = spanner.Client(project="test-project")
    db = client.instance(IN_PROCESS).database(
        f"own{os.getpid()}x{next(_names)}", ddl_statements=[USERS, Q1]
    )
    db.create().result(60)
    yield db
    db.drop()


def send(database: Any, keys: range) -> None:
    values = ", ".join(f"({k}, b'x')" for k in keys)
    database.run_in_transaction(
        lambda t: t.execute_update(f"INSERT INTO Q1 (Id, Payload) VALUES {values}")
    )


def receive(database: Any, batch: int, duration: str = "1s") -> list[int]:
    with database.snapshot() as snap:
        sql = f"SELECT Id FROM RECEIVE_Q1(max_batch_size => {batch}, max_duration => '{duration}')"
        return [row[0] for row in snap.execute_sql(sql)]


def test_a_claim_is_its_read_and_its_commit(database: Any, calls: collections.Counter[str]) -> None:
    send(database, range(3))
    calls.clear()
    assert sorted(receive(database, batch=3)) == [0, 1, 2]
    # a look (the strong read of has_due), the claim's read and commit, a look at the empty
    # queue; no BeginTransaction, nothing rolled back
    assert calls == {"ExecuteSql": 3, "Commit": 1}


def test_streams_claiming_at_once_never_abort_each_other(
    database: Any, calls: collections.Counter[str]
) -> None:
    send(database, range(60))
    calls.clear()
    got: list[int] = []
    lock = threading.Lock()

    def stream() -> None:
        while True:
            rows = receive(database, batch=1, duration="1s")
            if not rows:
                return
            with lock:
                got.extend(rows)

    threads = [threading.Thread(target=stream) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(got) == list(range(60))
    assert calls["Rollback"] == 0
    assert calls["BeginTransaction"] == 0

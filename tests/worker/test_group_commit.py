"""Group commit (``spanner_queues.worker.group``): several messages' receivers in one
transaction and one commit, on every engine. A failing receiver commits none of its writes and
the others commit; a transaction that loses a race runs the group again and each write commits
once; ``group=False`` runs alone; a backlog costs at most 0.1 run commits per message."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import IntegrityError, connections, transaction

from spanner_queues import api
from spanner_queues.drivers import driver_for
from spanner_queues.engines import engines
from spanner_queues.exceptions import InvalidArgument
from spanner_queues.receivers import ReceiverRegistry, receiver
from spanner_queues.worker import Worker, WorkerStats
from spanner_queues.worker.events import WorkerEvents
from tests.statements import statements_matching
from tests.testapp.models import Account, Jobs

pytestmark = pytest.mark.django_db(transaction=True)


def _fill(count: int) -> None:
    specs = [{"id": f"c{i:03}", "payload": b"x"} for i in range(count)]
    for start in range(0, count, 400):
        with transaction.atomic():
            api.send_many(Jobs, specs[start : start + 400])


def _drain(registry: ReceiverRegistry, count: int, **options: Any) -> tuple[WorkerStats, Any]:
    """Run a worker until ``count`` messages were acked, then stop it."""
    events = WorkerEvents()
    options.setdefault("prefetch", 20)
    worker = Worker(
        [Jobs],
        registry=registry,
        install_signal_handlers=False,
        summary_interval=None,
        listeners=[events],
        poll_interval=0.05,
        **options,
    )

    def stop_when_drained() -> None:
        events.wait_for("acked", count, timeout=120)
        worker.stop()

    stopper = threading.Thread(target=stop_when_drained, daemon=True)
    stopper.start()
    try:
        stats = worker.run()
    finally:
        worker.stop()
        stopper.join(10)
        engines["default"].stop_receiving(wait=30)
    assert events.counts["acked"] == count
    return stats, events


def _names() -> list[str]:
    return sorted(Account.objects.values_list("name", flat=True))


def test_a_failing_receiver_in_a_group_commits_none_of_its_writes_and_the_others_commit() -> None:
    count = 12
    registry = ReceiverRegistry()

    @receiver(Jobs, registry=registry)
    def write(message: Any) -> None:
        Account.objects.create(name=f"{message.key[0]}-{message.attempt or 1}")
        if message.key[0] == "c005" and (message.attempt or 1) == 1:
            raise ValueError("the first run of c005 fails after its write")

    _fill(count)
    stats, events = _drain(registry, count, group_size=count)
    names = _names()
    assert "c005-1" not in names  # the failed run's write never committed
    assert names.count("c005-2") == 1  # its second run's did, once
    others = [f"c{i:03}-1" for i in range(count) if i != 5]
    assert [n for n in names if n != "c005-2"] == others  # each committed once
    assert events.counts["failed"] == 1
    assert stats.groups < stats.grouped  # several messages shared a commit


def test_a_grouped_receiver_that_swallows_its_own_database_error_is_run_again_not_acked() -> None:
    """A receiver that catches a database error of its own write (here an ``IntegrityError``)
    and returns leaves its transaction marked for rollback: its other writes are gone, so its
    message must not be acked with them. Alone the ack itself refuses; in a group the ack comes
    at the group's end, so the receiver's part is rolled back and its run counts as failed."""
    count = 6
    registry = ReceiverRegistry()
    taken = Account.objects.create(name="taken")

    @receiver(Jobs, registry=registry)
    def write(message: Any) -> None:
        Account.objects.create(name=f"{message.key[0]}-{message.attempt or 1}")
        if message.key[0] == "c003" and (message.attempt or 1) == 1:
            try:
                Account.objects.create(pk=taken.pk, name="a second row under a taken key")
            except IntegrityError:
                pass  # swallowed: the transaction is now marked for rollback

    _fill(count)
    _, events = _drain(registry, count, group_size=count)
    names = [n for n in _names() if n != "taken"]
    assert "c003-1" not in names  # the run's write was rolled back ...
    assert names.count("c003-2") == 1  # ... so it ran again, and that run's write committed
    assert [n for n in names if n != "c003-2"] == [f"c{i:03}-1" for i in range(count) if i != 3]
    assert events.counts["failed"] == 1


def test_on_commit_callbacks_of_a_group_run_for_the_runs_that_committed_and_no_others() -> None:
    """Each grouped receiver's ``on_commit`` callback runs after the group commits, once per
    run that committed: a receiver that raises drops its own callback with its savepoint, never
    those of the receivers before it (the savepoints reuse their names: the callbacks of one
    released belong to the group's block)."""
    count = 6
    registry = ReceiverRegistry()
    ran: list[str] = []
    lock = threading.Lock()

    def record(name: str) -> None:
        with lock:
            ran.append(name)

    @receiver(Jobs, registry=registry)
    def write(message: Any) -> None:
        name = f"{message.key[0]}-{message.attempt or 1}"
        transaction.on_commit(lambda: record(name))
        if name == "c003-1":
            raise ValueError("the first run of c003 fails after registering its callback")

    _fill(count)
    _drain(registry, count, group_size=count)
    expected = [f"c{i:03}-1" for i in range(count) if i != 3] + ["c003-2"]
    assert sorted(ran) == sorted(expected)


def test_rows_handed_to_a_group_are_written_by_one_call_and_a_failed_runs_are_not() -> None:
    """``MessageContext.write_with_group``: the group writes the rows its runs handed it with
    one call a key, in its transaction; the row of a run that fails after handing it is
    dropped with its other writes (its next run's is written, once)."""
    count = 12
    registry = ReceiverRegistry()
    calls: list[list[str]] = []

    def write_rows(rows: list[str]) -> None:
        calls.append(list(rows))
        Account.objects.bulk_create([Account(name=name) for name in rows])

    @receiver(Jobs, registry=registry, takes_context=True)
    def hand(context: Any, message: Any) -> None:
        name = f"{message.key[0]}-{message.attempt or 1}"
        if not context.write_with_group("accounts", name, write_rows):
            write_rows([name])
        if name == "c005-1":
            raise ValueError("the first run of c005 fails after handing its row")

    _fill(count)
    _, events = _drain(registry, count, group_size=count)
    names = _names()
    assert "c005-1" not in names
    assert names.count("c005-2") == 1
    assert [n for n in names if n != "c005-2"] == [f"c{i:03}-1" for i in range(count) if i != 5]
    assert events.counts["failed"] == 1
    assert len(calls) < count  # several runs' rows in one call
    assert max(len(rows) for rows in calls) > 1, calls


def test_a_receiver_that_opts_out_runs_alone() -> None:
    count = 6
    registry = ReceiverRegistry()

    @receiver(Jobs, registry=registry, group=False)
    def write(message: Any) -> None:
        Account.objects.create(name=message.key[0])

    _fill(count)
    stats, _ = _drain(registry, count)
    assert stats.groups == 0 and stats.grouped == 0
    assert stats.commits == count  # one per message
    assert _names() == [f"c{i:03}" for i in range(count)]


class LostRace(Exception):
    """What each database's driver calls a lost race: SQLite's "locked", PostgreSQL's
    serialization failure (SQLSTATE 40001), Spanner's aborted transaction."""

    sqlstate = "40001"

    def __init__(self) -> None:
        super().__init__("database is locked; Transaction was aborted")


def test_a_group_that_loses_a_race_runs_again_and_commits_each_write_once() -> None:
    """A retryable error (SQLite's "locked", Spanner's ABORTED) in the middle of a group rolls
    the whole group back; its receivers all run again and each write commits once."""
    count = 10
    registry = ReceiverRegistry()
    raised: list[int] = []
    runs: list[str] = []

    @receiver(Jobs, registry=registry)
    def write(message: Any) -> None:
        runs.append(message.key[0])
        Account.objects.create(name=message.key[0])
        if message.key[0] == "c004" and not raised:
            raised.append(1)
            raise LostRace()

    assert driver_for("default").is_retryable(LostRace())
    _fill(count)
    _drain(registry, count, group_size=count)
    assert raised
    assert _names() == [f"c{i:03}" for i in range(count)]  # each once
    assert len(runs) > count  # the group ran again


def test_a_backlog_costs_at_most_0_1_run_commits_per_message() -> None:
    count = 200
    registry = ReceiverRegistry()

    @receiver(Jobs, registry=registry)
    def write(message: Any) -> None:
        Account.objects.create(name=message.key[0])

    _fill(count)
    stats, _ = _drain(registry, count, prefetch=50, group_size=50, group_ms=10_000)
    assert Account.objects.count() == count
    assert stats.commits / count <= 0.1, stats


def test_a_group_acks_its_messages_in_one_statement() -> None:
    """The acks of a group ride its commit in one statement (an ``executemany`` of the
    lease-checked DELETE, or one set-based DELETE), not one statement a message."""
    if engines["default"].features.supports_native_queues:
        pytest.skip("native acks are Spanner mutations (tests/native/test_calls_per_message.py)")
    count = 20
    registry = ReceiverRegistry()

    @receiver(Jobs, registry=registry)
    def write(message: Any) -> None:
        Account.objects.create(name=message.key[0])

    _fill(count)
    table = Jobs._meta.db_table
    with statements_matching(
        lambda sql: sql.lstrip().upper().startswith("DELETE") and table in sql
    ) as deletes:
        stats, _ = _drain(registry, count, prefetch=count, group_size=count, group_ms=10_000)
    assert Account.objects.count() == count
    assert stats.groups >= 1 and stats.grouped == count, stats
    assert len(deletes) <= stats.groups, deletes


def test_a_group_whose_commit_fails_runs_each_message_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit refused for a reason that is no lost race (a deferred constraint, say) fails
    the group's messages one by one: each runs again alone, and only the one whose writes
    cannot commit fails."""
    count = 8
    registry = ReceiverRegistry()
    poisoned: set[int] = set()  # threads whose open transaction cannot commit

    @receiver(Jobs, registry=registry)
    def write(message: Any) -> None:
        Account.objects.create(name=message.key[0])
        if message.key[0] == "c003":
            poisoned.add(threading.get_ident())

    wrapper = type(connections["default"])
    commit = wrapper.commit

    def refusing(self: Any) -> None:
        if threading.get_ident() in poisoned:
            poisoned.discard(threading.get_ident())
            raise IntegrityError("a deferred constraint refused the commit")
        commit(self)

    monkeypatch.setattr(wrapper, "commit", refusing)
    _fill(count)
    _, events = _drain(registry, count - 1, group_size=count)
    assert _names() == [f"c{i:03}" for i in range(count) if i != 3]  # each once
    assert {m.key[0] for m in events.messages("failed")} == {"c003"}


def test_group_limits_are_checked() -> None:
    with pytest.raises(InvalidArgument, match="group_size"):
        Worker([Jobs], registry=_registry(), install_signal_handlers=False, group_size=0)
    with pytest.raises(InvalidArgument, match="group_ms"):
        Worker([Jobs], registry=_registry(), install_signal_handlers=False, group_ms=-1)


def _registry() -> ReceiverRegistry:
    registry = ReceiverRegistry()
    receiver(Jobs, registry=registry)(lambda message: None)
    return registry

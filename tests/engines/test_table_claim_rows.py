"""Table engine: the rows of one claim are updated by one statement, each row by its own
compare-and-set on the deliver time the claim read."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.utils import timezone

from spanner_queues import api
from spanner_queues.drivers import driver_for
from spanner_queues.engines import engines
from spanner_queues.engines.table import Claim, row_statements
from spanner_queues.storage import rows
from tests.testapp.models import UserTasks

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.unless("supports_native_queues"),  # the native engine claims with RECEIVE
]


def test_a_row_whose_deliver_time_moved_is_not_claimed_the_others_are() -> None:
    db = engines["default"].database
    base = timezone.now() - timedelta(minutes=1)
    for name in ("a", "b", "c"):
        UserTasks.send(user_id=1, message_id=name, payload="x", deliver_time=base)
    read = {r.message_id: r.deliver_time for r in rows(UserTasks, db)}
    expires = timezone.now() + timedelta(minutes=5)
    claims = [
        Claim(
            key=(1, name),
            # "b" as if another claimer had moved its deliver time since it was read
            was_due=read[name] - timedelta(seconds=1) if name == "b" else read[name],
            lease_token=f"token-{name}",
            lease_expires_at=expires,
            attempts=1,
            deliver_time=expires,
        )
        for name in ("a", "b", "c")
    ]
    statements = row_statements(UserTasks, db)
    with transaction.atomic(using=db):
        assert statements.claim_many(claims) == [True, False, True]
    assert statements.held_by((1, "a")) == ["token-a"]
    assert statements.held_by((1, "b")) == [None]
    assert statements.held_by((1, "c")) == ["token-c"]
    [b] = api.receive(UserTasks, max_messages=3)  # a and c are leased; b is still due
    assert b.key == (1, "b")


def test_one_claim_leases_each_row_once_under_a_token_no_other_claim_holds() -> None:
    # one token for the whole claim where it is one statement (PostgreSQL; SQLite: a read
    # and one UPDATE), else one a row; never one another claim holds (an ack compares the key
    # and the token)
    db = engines["default"].database
    for i in range(25):
        UserTasks.send(user_id=2, message_id=f"m{i:02d}", payload=str(i))
    got = api.receive(UserTasks, max_messages=25)
    assert sorted(m.key for m in got) == [(2, f"m{i:02d}") for i in range(25)]
    driver = driver_for(db)
    one_statement = driver.claims_in_one_statement or driver.supports_json_each
    assert len({m.lease_token for m in got}) == (1 if one_statement else 25)
    statements = row_statements(UserTasks, db)
    for m in got:
        sent = str(int(m.key[1][1:]))
        assert m.attempt == 1 and m.payload in (sent, sent.encode())  # (a bytes queue)
        assert statements.held_by(m.key) == [m.lease_token]
    assert api.receive(UserTasks) == []
    UserTasks.send(user_id=2, message_id="later", payload="x")
    [later] = api.receive(UserTasks)
    assert later.lease_token not in {m.lease_token for m in got}


def _set(db: str, message_id: str, **values: Any) -> None:
    """Set columns of a queue row by hand (queue rows refuse the ORM's updates)."""
    connection = connections[db]
    quote = connection.ops.quote_name
    fields = {name: UserTasks._meta.get_field(name) for name in (*values, "message_id")}
    sets = ", ".join(f"{quote(fields[n].column)} = %s" for n in values)
    params = [fields[n].get_db_prep_save(v, connection) for n, v in values.items()]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(UserTasks._meta.db_table)} SET {sets} "
            f"WHERE {quote(fields['message_id'].column)} = %s",
            [*params, message_id],
        )


def test_a_claim_in_one_statement_takes_the_oldest_due_and_counts_expired_leases() -> None:
    # (SQLite: a read of the due rows and one UPDATE of their rowids)
    db = engines["default"].database
    driver = driver_for(db)
    if not (driver.claims_in_one_statement or driver.supports_json_each):
        pytest.skip("the claim reads its rows, then sets each (this database)")
    base = timezone.now() - timedelta(minutes=5)
    for i in (5, 3, 1, 0, 2, 4):  # sent out of order, due in order (a past time, as stored)
        UserTasks.send(user_id=3, message_id=f"m{i}", payload=str(i))
        _set(db, f"m{i}", deliver_time=base + timedelta(seconds=i))
    UserTasks.send(user_id=3, message_id="later", payload="x", delay=timedelta(minutes=5))
    first = api.receive(UserTasks, max_messages=4)
    assert [m.key[1] for m in first] == ["m0", "m1", "m2", "m3"]  # oldest due first
    assert [m.deliver_time for m in first] == [base + timedelta(seconds=i) for i in range(4)]
    # m4's lease ran out (set as a claim would have left it): claimed again, counted
    _set(db, "m4", attempts=2, lease_token="gone", lease_expires_at=base)
    engine = engines["default"]
    before = engine.lease_expirations(UserTasks)
    second = api.receive(UserTasks, max_messages=10)
    assert [(m.key[1], m.attempt) for m in second] == [("m4", 3), ("m5", 1)]
    assert engine.lease_expirations(UserTasks) == before + 1
    due_again = dict(rows(UserTasks, db).values_list("message_id", "deliver_time"))
    lease_end = second[0].lease_expires_at
    assert lease_end is not None
    # after the lease, each by its attempts: the third (m4) waits longer than the first (m5)
    assert due_again["m4"] - lease_end > due_again["m5"] - lease_end > timedelta(0)


def test_idle_receives_open_no_transaction_after_a_backlog_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a claim that came back full the next claim asks the table itself (no separate
    read); once one finds fewer than it asked for, idle receives again answer "nothing due"
    from a read, without a read-write transaction (SQLite: without the write lock)."""
    from spanner_queues.engines import table

    opened: list[int] = []
    real = table.run_in_transaction

    def counted(fn: Any, **kwargs: Any) -> Any:
        opened.append(1)
        return real(fn, **kwargs)

    monkeypatch.setattr(table, "run_in_transaction", counted)
    for i in range(4):
        UserTasks.send(user_id=3, message_id=f"b{i}", payload="x")
    assert len(api.receive(UserTasks, max_messages=2)) == 2  # full: a backlog
    assert len(api.receive(UserTasks, max_messages=2)) == 2  # full again
    assert opened
    assert api.receive(UserTasks, max_messages=2) == []  # found none: the backlog is over
    idle_from = len(opened)
    for _ in range(3):
        assert api.receive(UserTasks, max_messages=2) == []
    assert len(opened) == idle_from  # idle: no transaction opened


def _statements(db: str) -> Any:
    """A context counting the statements sent on ``db``: (kind, executemany?) each."""
    import contextlib

    sent: list[tuple[str, bool]] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append((sql.split(None, 1)[0].upper(), many))
        return execute(sql, params, many, context)

    @contextlib.contextmanager
    def counting() -> Any:
        with connections[db].execute_wrapper(wrapper):
            yield sent

    return counting()


@pytest.mark.parametrize("size", [1, 40])
def test_a_claim_of_the_head_on_sqlite_is_one_read_and_one_update_whatever_its_size(
    size: int,
) -> None:
    db = engines["default"].database
    if not driver_for(db).supports_json_each:
        pytest.skip("SQLite with its JSON functions")
    UserTasks.send_many([{"user_id": 4, "message_id": f"r{i:02d}"} for i in range(size)])
    with _statements(db) as sent:
        got = api.receive(UserTasks, max_messages=size)
    assert len(got) == size
    writes = [s for s in sent if s[0] in ("UPDATE", "INSERT", "DELETE")]
    assert writes == [("UPDATE", False)]  # before: one executemany of an UPDATE a row


def test_acks_of_a_batch_on_sqlite_are_one_delete_of_a_json_array() -> None:
    db = engines["default"].database
    if not driver_for(db).supports_json_each:
        pytest.skip("SQLite with its JSON functions")
    UserTasks.send_many([{"user_id": 5, "message_id": f"a{i:02d}"} for i in range(30)])
    got = api.receive(UserTasks, max_messages=30)
    stale = got[-1]
    _set(db, stale.key[1], lease_token="someone-else")  # its lease went to another claim
    with _statements(db) as sent:
        api.ack_many(UserTasks, got[:-1])
    assert [s for s in sent if s[0] == "DELETE"] == [("DELETE", False)]  # not executemany
    assert sorted(rows(UserTasks, db).values_list("message_id", flat=True)) == [stale.key[1]]
    with pytest.raises(Exception, match="no longer the message's"), transaction.atomic(using=db):
        api.ack_many(UserTasks, [stale])  # compared by key and token, as one a row was
    assert rows(UserTasks, db).count() == 1


def test_a_claim_in_one_statement_builds_its_messages_after_its_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where a claim is one statement (SQLite, PostgreSQL) its rows are converted and its
    messages built once the transaction committed: on SQLite its single write lock is let go
    first (building them was a third of the time a claim held it)."""
    import spanner_queues.engines.table as table

    db = engines["default"].database
    driver = driver_for(db)
    if not (driver.claims_in_one_statement or driver.supports_json_each):
        pytest.skip("the claim reads, then sets each row: its messages are built in it")
    in_transaction: list[bool] = []
    real = table.leased_message

    def built(*args: Any) -> Any:
        in_transaction.append(connections[db].in_atomic_block)
        return real(*args)

    monkeypatch.setattr(table, "leased_message", built)
    UserTasks.send_many([{"user_id": 1, "message_id": str(i), "payload": "x"} for i in range(3)])
    got = api.receive(UserTasks, max_messages=3)
    assert sorted(m.key for m in got) == [(1, "0"), (1, "1"), (1, "2")]
    assert all(m.lease_token for m in got)
    assert in_transaction == [False, False, False]

"""Messages on the front, with google-cloud-spanner exactly as Google's queue pages use it:
INSERT and Send, RECEIVE, RENEWLEASE, DELETE ... ASSERT_ROWS_MODIFIED 1 and Ack."""

from __future__ import annotations

import base64
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import grpc
import pytest
from google.api_core import exceptions as gexc
from google.cloud.spanner_v1 import param_types

from tests.conftest import wait_until

UTC = timezone.utc
RECEIVE_ALL = (
    "SELECT * FROM RECEIVE_UserTasks(max_batch_size => 10, priority => NULL, max_duration => '1s')"
)


def receive(database: Any, sql: str = RECEIVE_ALL) -> list[list[Any]]:
    with database.snapshot() as snap:  # strong, single use: Google's samples
        return list(snap.execute_sql(sql))


def add_user(t: Any, user_id: int = 7) -> None:
    t.execute_update(f"INSERT INTO Users (UserId, Name) VALUES ({user_id}, 'ada')")


# --- sending ---------------------------------------------------------------------------------
def test_insert_with_business_writes_commits_together(database: Any) -> None:
    def signup(t: Any) -> None:
        add_user(t)
        t.execute_update(
            "INSERT INTO UserTasks (UserId, MessageId, Payload) VALUES (7, 'welcome', b'hi')"
        )

    database.run_in_transaction(signup)
    [row] = receive(database)
    assert row[:3] == [7, "welcome", base64.b64encode(b"hi")]
    assert len(row) == 7  # 2 keys, Payload, DeliverTime, expiry, token, last-in-batch


def test_rollback_leaves_nothing(database: Any) -> None:
    class Boom(Exception):
        pass

    def signup(t: Any) -> None:
        add_user(t)
        t.execute_update(
            "INSERT INTO UserTasks (UserId, MessageId, Payload) VALUES (7, 'welcome', b'hi')"
        )
        raise Boom

    with pytest.raises(Boom):
        database.run_in_transaction(signup)
    with database.snapshot() as snap:
        assert list(snap.execute_sql("SELECT COUNT(*) FROM UserTasks")) == [[0]]


def test_duplicate_key_is_already_exists(database: Any) -> None:
    insert = "INSERT INTO SampleQueue (Id, Payload) VALUES (1, 'x')"
    database.run_in_transaction(lambda t: t.execute_update(insert))
    with pytest.raises(gexc.AlreadyExists):
        database.run_in_transaction(lambda t: t.execute_update(insert))
    with pytest.raises(gexc.AlreadyExists):
        with database.batch() as batch:
            batch.send(queue="SampleQueue", key=(1,), payload="again")


def test_future_deliver_time_is_not_delivered_early(database: Any) -> None:
    due = datetime.now(UTC) + timedelta(seconds=2)
    database.run_in_transaction(
        lambda t: t.execute_update(
            "INSERT INTO SampleQueue (Id, Payload, DeliverTime) VALUES (1, 'later', @due)",
            params={"due": due},
            param_types={"due": param_types.TIMESTAMP},
        )
    )
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(2,), payload="now")
        batch.send(
            queue="SampleQueue", key=(3,), payload="past", deliver_time=due - timedelta(days=1)
        )
    sql = "SELECT Id FROM RECEIVE_SampleQueue(max_batch_size => 10, max_duration => '1s')"
    assert sorted(r[0] for r in receive(database, sql)) == [2, 3]  # a past time means now
    assert wait_until(lambda: receive(database, sql)) == [[1]]
    assert datetime.now(UTC) >= due


def test_send_and_ack_mutations_in_a_transaction(database: Any) -> None:
    def send(t: Any) -> None:
        add_user(t)
        t.send(queue="UserTasks", key=(7, "m1"), payload=base64.b64encode(b"one"))

    database.run_in_transaction(send)
    [row] = receive(database)
    database.run_in_transaction(lambda t: t.ack(queue="UserTasks", key=(7, "m1")))
    assert receive(database) == []
    with database.snapshot() as snap:
        assert list(snap.execute_sql("SELECT COUNT(*) FROM UserTasks")) == [[0]]
    assert row[:2] == [7, "m1"]


def test_ack_of_a_missing_message_is_not_found_and_nothing_applies(database: Any) -> None:
    def ack_and_write(t: Any) -> None:
        add_user(t, 8)
        t.ack(queue="SampleQueue", key=(404,))

    with pytest.raises(gexc.NotFound, match="Message not found"):
        database.run_in_transaction(ack_and_write)
    with pytest.raises(gexc.NotFound, match="Message not found"):
        with database.batch() as batch:
            batch.insert(table="Users", columns=("UserId", "Name"), values=[(9, "bob")])
            batch.ack(queue="SampleQueue", key=(404,))
    with database.snapshot() as snap:
        assert list(snap.execute_sql("SELECT COUNT(*) FROM Users")) == [[0]]
    with database.batch() as batch:  # ignore_not_found: succeeds
        batch.ack(queue="SampleQueue", key=(404,), ignore_not_found=True)


def test_ack_then_send_replaces_a_message_in_one_batch(database: Any) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="v1")
    with database.batch() as batch:  # Google: Ack must precede Send
        batch.ack(queue="SampleQueue", key=(1,))
        batch.send(queue="SampleQueue", key=(1,), payload="v2")
    with database.snapshot() as snap:
        assert list(snap.execute_sql("SELECT Id, Payload FROM SampleQueue")) == [[1, "v2"]]


def test_update_of_a_queue_and_write_mutations_are_refused(database: Any) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="v1")
    with pytest.raises(gexc.InvalidArgument, match="UPDATE is not supported on queue"):
        database.run_in_transaction(
            lambda t: t.execute_update("UPDATE SampleQueue SET Payload = 'x' WHERE Id = 1")
        )
    with pytest.raises(gexc.InvalidArgument, match="not supported on queue"):
        with database.batch() as batch:
            batch.update(table="SampleQueue", columns=("Id", "Payload"), values=[(1, "x")])


# --- the Python sample (queue_snippets.py) ---------------------------------------------------
def test_googles_python_sample_unchanged(database: Any) -> None:
    """queue_snippets.py's send, receive and ack, as published. Its RECEIVE streams for
    max_duration '1m'; the sample reads it in a thread here, and the test goes on at the
    first message (the stream ends by itself)."""
    import queue as queue_module

    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="Hello")
    received: queue_module.Queue = queue_module.Queue()

    def receive_messages() -> None:
        with database.snapshot() as snapshot:
            results = snapshot.execute_sql(
                "SELECT Id, Payload FROM RECEIVE_SampleQueue(max_duration => '1m')"
            )
            for row in results:
                received.put(row)

    threading.Thread(target=receive_messages, daemon=True).start()
    assert received.get(timeout=30) == [1, "Hello"]
    with database.batch() as batch:
        batch.ack(queue="SampleQueue", key=(1,))
    with database.snapshot() as snap:
        assert list(snap.execute_sql("SELECT COUNT(*) FROM SampleQueue")) == [[0]]


# --- receiving -------------------------------------------------------------------------------
def test_receive_is_a_stream_of_batches(database: Any) -> None:
    with database.batch() as batch:
        for i in range(5):
            batch.send(queue="SampleQueue", key=(i,), payload=str(i))
    sql = (
        "SELECT Id, SpannerLastBatchMessage, SpannerLeaseExpirationTimestamp FROM "
        "RECEIVE_SampleQueue(max_batch_size => 2, max_duration => '1s')"
    )
    rows = receive(database, sql)
    assert sorted(r[0] for r in rows) == [0, 1, 2, 3, 4]  # more than max_batch_size per call
    assert [r[1] for r in rows] == [False, True, False, True, True]
    now = datetime.now(UTC)
    for row in rows:
        assert now < row[2] <= now + timedelta(seconds=10)  # a 10 s lease


def test_a_call_shorter_than_its_first_look_still_returns_what_is_due(database: Any) -> None:
    """A call looks at its queue once, however short its ``max_duration``: the client's 1 ms
    probe on a loaded machine ended before its first look and returned nothing, and a worker
    that had just sent its messages received none (CI's native stage, three tests)."""
    with database.batch() as batch:
        for i in range(3):
            batch.send(queue="SampleQueue", key=(i,), payload=str(i))
    # 0.1 microseconds: over before the front's loop could ever start
    sql = "SELECT Id FROM RECEIVE_SampleQueue(max_batch_size => 3, max_duration => '0.0001ms')"
    assert sorted(r[0] for r in receive(database, sql)) == [0, 1, 2]


def test_concurrent_streams_never_lease_one_message_twice(database: Any) -> None:
    with database.batch() as batch:
        for i in range(40):
            batch.send(queue="SampleQueue", key=(i,), payload=str(i))
    sql = "SELECT Id FROM RECEIVE_SampleQueue(max_batch_size => 3, max_duration => '2s')"
    got: list[list[int]] = [[], [], []]

    def run(i: int) -> None:
        got[i] = [r[0] for r in receive(database, sql)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [i for part in got for i in part]
    assert sorted(everything) == list(range(40))


def test_a_call_ends_at_max_duration_with_every_row_it_leased_sent(database: Any) -> None:
    """RECEIVE ends by itself when ``max_duration`` elapses, also while messages keep becoming
    due, and rows it leased are sent before the call ends: none is left leased to nobody (a
    burst worker relies on it to exit with nothing leased behind it)."""
    done = threading.Event()
    sent: list[int] = []

    def keep_sending() -> None:
        while not done.is_set() and len(sent) < 500:
            with database.batch() as batch:
                batch.send(queue="SampleQueue", key=(len(sent),), payload="x")
            sent.append(len(sent))

    sender = threading.Thread(target=keep_sending)
    sender.start()
    try:
        wait_until(lambda: sent)
        sql = "SELECT Id FROM RECEIVE_SampleQueue(max_batch_size => 1, max_duration => '1s')"
        first = [r[0] for r in receive(database, sql)]  # returns: the call ended
    finally:
        done.set()
        sender.join()
    assert first
    everything = sql.replace("max_batch_size => 1,", "max_batch_size => 1000,")
    rest = [r[0] for r in receive(database, everything)]  # what the first call did not lease
    assert not set(first) & set(rest)
    assert sorted(first + rest) == sent  # nothing leased by the first call and left unsent


def test_unacked_message_comes_back_after_lease_and_back_off(database: Any) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="x")
    sql = (
        "SELECT Id, SpannerLeaseToken, SpannerLeaseExpirationTimestamp "
        "FROM RECEIVE_SampleQueue(max_duration => '1s')"
    )
    [first] = receive(database, sql)
    assert receive(database, sql) == []  # leased
    second = wait_until(lambda: receive(database, sql), timeout=40)[0]
    assert datetime.now(UTC) >= first[2] + timedelta(seconds=1)  # lease, then back-off
    assert second[0] == 1 and second[1] != first[1]


@pytest.mark.parametrize("how", ["stale", "read_write"])
def test_receive_outside_a_strong_read_is_refused(database: Any, how: str) -> None:
    sql = "SELECT * FROM RECEIVE_SampleQueue(max_duration => '1s')"
    with pytest.raises(gexc.InvalidArgument, match="strong read-only"):
        if how == "stale":
            with database.snapshot(exact_staleness=timedelta(seconds=5)) as snap:
                list(snap.execute_sql(sql))
        else:
            database.run_in_transaction(lambda t: list(t.execute_sql(sql)))


# --- renewing --------------------------------------------------------------------------------
def leased(database: Any) -> list[Any]:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="x")
    [row] = receive(
        database,
        "SELECT Id, SpannerLeaseToken, SpannerLeaseExpirationTimestamp "
        "FROM RECEIVE_SampleQueue(max_duration => '1s')",
    )
    return row


def renew(database: Any, sql: str, **params: Any) -> list[list[Any]]:
    types = {
        k: param_types.Array(param_types.STRING) if isinstance(v, list) else param_types.STRING
        for k, v in params.items()
    }
    with database.snapshot() as snap:
        return list(snap.execute_sql(sql, params=params or None, param_types=types or None))


def test_renewlease_with_an_array_literal_rotates_the_token(database: Any) -> None:
    _, token, expires = leased(database)
    [[old, new, new_expiry]] = renew(
        database, "SELECT * FROM RENEWLEASE_SampleQueue(lease_tokens => [@token1])", token1=token
    )
    assert old == token and new != token and new_expiry >= expires
    # The old token is superseded: still within its lease, but no longer renewable.
    [[_, none, _]] = renew(
        database, "SELECT * FROM RENEWLEASE_SampleQueue(lease_tokens => [@t])", t=token
    )
    assert none is None
    # The new one renews again, also as one ARRAY<STRING> parameter.
    [[_, newer, _]] = renew(
        database, "SELECT * FROM RENEWLEASE_SampleQueue(lease_tokens => @tokens)", tokens=[new]
    )
    assert newer not in (None, new)


def test_renewlease_answers_for_bad_expired_and_acked_tokens(database: Any) -> None:
    _, token, expires = leased(database)
    assert (
        renew(database, "SELECT * FROM RENEWLEASE_SampleQueue(lease_tokens => ['not-a-token'])")
        == []
    )
    with database.batch() as batch:
        batch.ack(queue="SampleQueue", key=(1,))
    rows = renew(
        database,
        "SELECT SpannerOldLeaseToken, SpannerNewLeaseToken "
        "FROM RENEWLEASE_SampleQueue(lease_tokens => [@t])",
        t=token,
    )
    assert rows == [[token, None]]  # acked while the lease is live: a row with NULL
    wait_until(lambda: datetime.now(UTC) > expires, timeout=15)
    assert (
        renew(database, "SELECT * FROM RENEWLEASE_SampleQueue(lease_tokens => [@t])", t=token) == []
    )


# --- acking with DML -------------------------------------------------------------------------
def test_delete_assert_rows_modified_is_at_most_once(database: Any) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="x")
    ack = "DELETE FROM SampleQueue WHERE Id = 1 ASSERT_ROWS_MODIFIED 1"
    assert database.run_in_transaction(lambda t: t.execute_update(ack)) == 1
    with pytest.raises(gexc.OutOfRange, match="ASSERT_ROWS_MODIFIED"):
        database.run_in_transaction(lambda t: t.execute_update(ack))
    # A plain DELETE hides the lost race, as Google warns.
    assert (
        database.run_in_transaction(
            lambda t: t.execute_update("DELETE FROM SampleQueue WHERE Id = 1")
        )
        == 0
    )


def test_deleting_the_parent_cascades_to_its_queue(database: Any) -> None:
    def signup(t: Any) -> None:
        add_user(t)
        t.send(queue="UserTasks", key=(7, "welcome"), payload=base64.b64encode(b"hi"))

    database.run_in_transaction(signup)
    database.run_in_transaction(lambda t: t.execute_update("DELETE FROM Users WHERE UserId = 7"))
    with database.snapshot() as snap:
        assert list(snap.execute_sql("SELECT COUNT(*) FROM UserTasks")) == [[0]]


def test_a_delivery_leaves_deliver_time_as_sent(database: Any) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="x")
    before = receive(database, "SELECT DeliverTime FROM SampleQueue")
    [[_, shown]] = receive(
        database, "SELECT Id, DeliverTime FROM RECEIVE_SampleQueue(max_duration => '1s')"
    )
    assert [[shown]] == before == receive(database, "SELECT DeliverTime FROM SampleQueue")
    # still leased though: not handed out again while its lease lasts
    assert receive(database, "SELECT Id FROM RECEIVE_SampleQueue(max_duration => '1s')") == []


# --- limits: 950 query parameters (issue 20) -------------------------------------------------
PARAMETER_LIMIT = "Number of parameters in query exceeds the maximum allowed limit of 950"


def renew_sql(count: int) -> str:
    tokens = ", ".join(f"@t{i}" for i in range(count))
    return f"SELECT * FROM RENEWLEASE_SampleQueue(lease_tokens => [{tokens}])"


def test_renewlease_with_more_than_950_parameters_is_refused_as_on_spanner(
    database: Any,
) -> None:
    """The front answers RENEWLEASE itself: it applies Spanner's limit as the emulator does to
    the statements it runs, on ExecuteStreamingSql and ExecuteSql alike."""
    from google.cloud.spanner_v1 import ExecuteSqlRequest
    from google.cloud.spanner_v1._helpers import _make_value_pb
    from google.protobuf import struct_pb2

    _, token, _ = leased(database)
    assert renew(database, renew_sql(950), **{f"t{i}": token for i in range(950)})
    with pytest.raises(gexc.InvalidArgument, match=PARAMETER_LIMIT):
        renew(database, renew_sql(951), **{f"t{i}": token for i in range(951)})
    session = database.session()
    session.create()
    try:
        params = struct_pb2.Struct()
        for i in range(951):
            params.fields[f"t{i}"].CopyFrom(_make_value_pb(token))
        request = ExecuteSqlRequest(
            session=session.name,
            sql=renew_sql(951),
            params=params,
            param_types={f"t{i}": param_types.STRING for i in range(951)},
        )
        with pytest.raises(gexc.InvalidArgument, match=PARAMETER_LIMIT):
            database.spanner_api.execute_sql(
                request=request, metadata=[("google-cloud-resource-prefix", database.name)]
            )
    finally:
        session.delete()


def test_insert_with_more_than_950_parameters_is_refused_by_the_emulator(database: Any) -> None:
    rows = ", ".join(f"(@i{i}, 'x')" for i in range(951))
    params = {f"i{i}": i for i in range(951)}
    types = {f"i{i}": param_types.INT64 for i in range(951)}
    with pytest.raises(gexc.InvalidArgument, match=PARAMETER_LIMIT):
        database.run_in_transaction(
            lambda t: t.execute_update(
                f"INSERT INTO SampleQueue (Id, Payload) VALUES {rows}",
                params=params,
                param_types=types,
            )
        )


def test_batch_dml_statement_with_more_than_950_parameters_is_refused(database: Any) -> None:
    rows = ", ".join(f"(@i{i}, 'x')" for i in range(951))
    statement = (
        f"INSERT INTO SampleQueue (Id, Payload) VALUES {rows}",
        {f"i{i}": i for i in range(951)},
        {f"i{i}": param_types.INT64 for i in range(951)},
    )
    small = ("INSERT INTO SampleQueue (Id, Payload) VALUES (5000, 'x')", {}, {})

    def batch(t: Any) -> Any:
        return t.batch_update([small, statement])

    status, counts = database.run_in_transaction(batch)
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert PARAMETER_LIMIT in status.message
    assert counts == [1]  # the statements before it ran, as Spanner answers a batch


def test_renewals_of_any_size_go_in_chunks(database: Any) -> None:
    from spanner_queues.engines.native import client
    from spanner_queues.engines.spanner_ddl import GoogleSQL, KeyColumn, QueueDeclaration

    _, token, _ = leased(database)
    decl = QueueDeclaration(name="SampleQueue", keys=(KeyColumn("Id", "BigIntegerField"),))
    dialect = GoogleSQL()
    tokens = [f"gone-{i}" for i in range(1200)] + [token]
    renewed = client.renew_all(
        database, lambda n: dialect.renew(decl, n), dialect.renew_params, tokens
    )
    assert list(renewed) == [token] and renewed[token][0] not in (None, token)


# --- a missing parent row (issue 20) -----------------------------------------------------------
def test_missing_parent_row_is_not_found_in_spanners_words(database: Any) -> None:
    words = r"^404 Parent row for row \[7\] in table UserTasks is missing\. Row cannot be written\."
    with pytest.raises(gexc.NotFound, match=words):
        database.run_in_transaction(
            lambda t: t.execute_update(
                "INSERT INTO UserTasks (UserId, MessageId, Payload) VALUES (7, 'w', b'hi')"
            )
        )
    with pytest.raises(gexc.NotFound, match=words):
        with database.batch() as batch:
            batch.send(queue="UserTasks", key=(7, "w"), payload=base64.b64encode(b"hi"))


# --- round trips of an ack (issue 20), counted at the client ---------------------------------
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("size", [1, 20, 400])
def test_an_ack_costs_one_round_trip_per_receiver_transaction_whatever_the_batch_size(
    size: int,
) -> None:
    from django.db import transaction

    from spanner_queues import api
    from tests.native.grpc_calls import counting
    from tests.testapp.models import Account, Jobs

    api.send_many(Jobs, [{"id": f"m{i}", "payload": b""} for i in range(size)])
    with counting() as bare:  # the receiver's own transaction: a write and its commit
        with transaction.atomic():
            Account.objects.create(name="work")
    with counting() as acking:
        with transaction.atomic():
            Account.objects.create(name="work")
            api.ack_many(Jobs, [(f"m{i}",) for i in range(size)])
    assert acking.total() - bare.total() == 1, (acking.work_calls(), bare.work_calls())
    assert not Jobs.objects.exists()


# --- a retried commit (issue 20) ---------------------------------------------------------------
@pytest.mark.parametrize("kind", ["ack", "send"])
def test_a_retried_commit_of_a_read_write_transaction_answers_as_the_first(
    database: Any, kind: str
) -> None:
    """The client retries Commit on UNAVAILABLE; a commit with a transaction id is safe to
    retry, so a retry after the first applied must get the first answer, not an error."""
    from google.cloud.spanner_v1 import CommitRequest, Mutation, TransactionOptions
    from google.cloud.spanner_v1._helpers import _make_list_value_pb, _make_value_pb

    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="x")
    if kind == "ack":
        mutation = Mutation(ack=Mutation.Ack(queue="SampleQueue", key=_make_list_value_pb([1])))
    else:
        mutation = Mutation(
            send=Mutation.Send(
                queue="SampleQueue", key=_make_list_value_pb([2]), payload=_make_value_pb("y")
            )
        )
    api = database.spanner_api
    metadata = [("google-cloud-resource-prefix", database.name)]
    session = database.session()
    session.create()
    try:
        txn = api.begin_transaction(
            session=session.name,
            options=TransactionOptions(read_write=TransactionOptions.ReadWrite()),
            metadata=metadata,
        )
        request = CommitRequest(session=session.name, transaction_id=txn.id, mutations=[mutation])
        first = api.commit(request=request, metadata=metadata, retry=None)
        again = api.commit(request=request, metadata=metadata, retry=None)
        assert again.commit_timestamp == first.commit_timestamp
    finally:
        session.delete()
    with database.snapshot() as snap:
        ids = [row[0] for row in snap.execute_sql("SELECT Id FROM SampleQueue ORDER BY Id")]
    assert ids == ([] if kind == "ack" else [1, 2])

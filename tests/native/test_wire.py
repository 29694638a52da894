"""Wire-level tests: the exact SQL, parameters, transactions and mutations the native engine
sends, and how it reacts to the documented errors. Each documented statement or mutation has a
test here (see docs/howto/spanner.md)."""

from __future__ import annotations

import base64
from datetime import timedelta

import grpc
import pytest
from django.core.management import call_command
from django.db import connection, models, transaction
from django.utils import timezone

from spanner_queues import api
from spanner_queues.engines import engines
from spanner_queues.exceptions import LeaseLost, MessageAlreadyAcked
from tests.conftest import receive_due, wait_until
from tests.native.conftest import database_ddl
from tests.testapp.models import Account, Greetings, Jobs, JsonEvents, UploadTasks, UserTasks

pytestmark = pytest.mark.django_db(transaction=True)
RECEIVE_USERTASKS = (
    "SELECT user_id, message_id, Payload, DeliverTime, SpannerLeaseToken, "
    "SpannerLeaseExpirationTimestamp, SpannerLastBatchMessage FROM "
    "RECEIVE_testapp_usertasks(max_batch_size => {n}, max_duration => '{d}')"
)


def engine():
    return engines["default"]


def params(request) -> dict:
    return dict(request.params)


def ddl_sent(front) -> list[str]:
    """The DDL statements sent since the test started (UpdateDatabaseDdl), in order."""
    return [
        s for r in front.requests() if r.method == "UpdateDatabaseDdl" for s in r.request.statements
    ]


def test_create_queue_ddl_on_the_wire(front) -> None:
    ddl = database_ddl()
    assert (
        "CREATE QUEUE testapp_usertasks (\n"
        "  user_id INT64 NOT NULL,\n"
        "  message_id STRING(64) NOT NULL,\n"
        "  Payload BYTES(MAX) NOT NULL\n"
        ") PRIMARY KEY (user_id, message_id)"
    ) in ddl
    assert (
        "CREATE QUEUE testapp_uploadtasks (\n"
        "  id INT64 NOT NULL,\n"
        "  message_id STRING(64) NOT NULL,\n"
        "  Payload BYTES(MAX) NOT NULL\n"
        ") PRIMARY KEY (id, message_id), INTERLEAVE IN PARENT testapp_upload ON DELETE CASCADE"
    ) in ddl
    queue_ddl = [s for s in ddl if "QUEUE" in s]
    columns = [s.split(") PRIMARY KEY")[0] for s in queue_ddl]  # (a TTL may name DeliverTime)
    assert not any(
        f in c for c in columns for f in ("send_time", "attempts", "lease_", "DeliverTime")
    )
    assert not any(",\n)" in s for s in queue_ddl)  # no trailing commas


def test_payload_types_and_ttl_in_the_create_queue_ddl(front) -> None:
    ddl = database_ddl()
    assert (
        "CREATE QUEUE testapp_greetings (\n"
        "  id INT64 NOT NULL,\n"
        "  Payload STRING(MAX) NOT NULL\n"
        ") PRIMARY KEY (id), ROW DELETION POLICY (OLDER_THAN(DeliverTime, INTERVAL 7 DAY))"
    ) in ddl
    assert (
        "CREATE QUEUE testapp_jsonevents (\n"
        "  id STRING(64) NOT NULL,\n"
        "  Payload JSON NOT NULL\n"
        ") PRIMARY KEY (id)"
    ) in ddl


def test_string_and_json_payloads_are_never_base64(front) -> None:
    Greetings.send(id=1, payload="héllo")
    JsonEvents.send(id="e", payload={"b": 1, "a": "é"})
    [text] = front.sql("INSERT INTO testapp_greetings")
    assert text.sql == "INSERT INTO testapp_greetings (id, Payload) VALUES (@a0, @a1)"
    assert params(text.request) == {"a0": "1", "a1": "héllo"}
    assert text.request.param_types["a1"].code.name == "STRING"
    [json_insert] = front.sql("INSERT INTO testapp_jsonevents")
    # JSON text bound as a STRING and parsed by Spanner (a JSON column takes no STRING).
    assert json_insert.sql == (
        "INSERT INTO testapp_jsonevents (id, Payload) "
        "VALUES (@a0, PARSE_JSON(@a1, wide_number_mode=>'round'))"
    )
    assert params(json_insert.request) == {"a0": "e", "a1": '{"a":"é","b":1}'}
    got = {m.queue: m for m in wait_until(lambda: api.receive(Greetings))}
    got |= {m.queue: m for m in wait_until(lambda: api.receive(JsonEvents))}
    assert got["testapp.Greetings"].payload == "héllo".encode()
    assert got["testapp.JsonEvents"].payload == '{"a":"é","b":1}'.encode()
    assert Greetings.objects.get(pk=1).payload == "héllo"
    assert JsonEvents.objects.get(pk="e").payload == '{"a":"é","b":1}'


def test_send_mutations_carry_string_and_json_payloads_as_text(front) -> None:
    engine().send_mutations(Greetings, [api.build_message(Greetings, {"id": 2, "payload": "hi"})])
    engine().send_mutations(
        JsonEvents, [api.build_message(JsonEvents, {"id": "m", "payload": [1, {"k": None}]})]
    )
    first, second = (c.mutations[0].send for c in front.commits())
    assert first.queue == "testapp_greetings" and first.payload == "hi"
    assert second.queue == "testapp_jsonevents" and second.payload == '[1,{"k":null}]'
    assert wait_until(lambda: api.receive(JsonEvents))[0].json() == [1, {"k": None}]


def test_a_queue_created_outside_django_is_used_through_an_unmanaged_model(front) -> None:
    """Google's sample queue, created by hand: declare the matching model, unmanaged."""
    from django.test.utils import isolate_apps

    from spanner_queues.models import Queue

    with connection.schema_editor() as editor:
        editor.execute(
            "CREATE QUEUE q (Id INT64 NOT NULL, Payload STRING(MAX) NOT NULL) PRIMARY KEY (Id)"
        )
    try:
        with isolate_apps("tests.testapp"):

            class SampleQueue(Queue):
                id = models.BigIntegerField(primary_key=True, db_column="Id")

                class Meta:
                    app_label = "testapp"
                    managed = False
                    db_table = "q"

                class QueueMeta:
                    payload_type = "string"

            api.send(SampleQueue, id=1, payload="Hello")
            [message] = wait_until(lambda: api.receive(SampleQueue))
            assert (message.key, message.text()) == ((1,), "Hello")
            [call] = [r for r in front.sql("RECEIVE_q(") if r.method == "ExecuteStreamingSql"]
            assert call.sql.startswith("SELECT Id, Payload, DeliverTime, SpannerLeaseToken")
            api.ack_many(SampleQueue, [message])  # (isolated: not found by its label)
            assert not SampleQueue.objects.exists()
            engine().stop_receiving(SampleQueue, wait=0)
    finally:
        front.end_streams()
        engine().stop_receiving(wait=5)
        with connection.schema_editor() as editor:
            editor.execute("DROP QUEUE q")


def test_drop_queue_through_the_schema_editor(front) -> None:
    from spanner_queues.options import queue_options

    with connection.schema_editor() as editor:
        engine().drop_queue(editor, Jobs, queue_options(Jobs))
    assert ddl_sent(front)[-1] == "DROP QUEUE testapp_jobs"
    with connection.schema_editor() as editor:
        engine().create_queue(editor, Jobs, queue_options(Jobs))
    assert ddl_sent(front)[-1].startswith("CREATE QUEUE testapp_jobs (")


def test_send_is_insert_dml_in_the_callers_transaction(front) -> None:
    later = timezone.now() + timedelta(hours=1)
    with transaction.atomic():
        Account.objects.create(name="ada")
        UserTasks.send(user_id=7, message_id="now", payload=b"\x00hi")
        UserTasks.send(user_id=7, message_id="later", payload="x", deliver_time=later)
    [now_insert] = front.sql("INSERT INTO testapp_usertasks (user_id, message_id, Payload) ")
    assert now_insert.sql == (
        "INSERT INTO testapp_usertasks (user_id, message_id, Payload) VALUES (@a0, @a1, @a2)"
    )
    assert params(now_insert.request) == {
        "a0": "7",
        "a1": "now",
        "a2": base64.b64encode(b"\x00hi").decode(),
    }
    [later_insert] = front.sql("DeliverTime) VALUES")
    assert later_insert.sql == (
        "INSERT INTO testapp_usertasks (user_id, message_id, Payload, DeliverTime) "
        "VALUES (@a0, @a1, @a2, @a3)"
    )
    # One read-write transaction: the account insert began it, the sends joined it.
    account = front.sql("INSERT INTO testapp_account")[0].request
    assert "begin" in account.transaction
    assert now_insert.request.transaction.id == later_insert.request.transaction.id
    assert len(front.commits()) == 1 and not front.commits()[0].mutations


def test_send_many_is_one_multi_row_insert(front) -> None:
    UserTasks.send_many([{"user_id": 1, "message_id": m, "payload": ""} for m in "ab"])
    [insert] = front.sql("INSERT INTO testapp_usertasks")
    assert insert.sql.endswith("VALUES (@a0, @a1, @a2), (@a3, @a4, @a5)")


def test_receive_is_a_strong_single_use_streaming_query(front) -> None:
    UserTasks.send(user_id=1, message_id="a", payload="x")
    [message] = api.receive(UserTasks)
    call = next(r for r in front.sql("RECEIVE_") if r.method == "ExecuteStreamingSql")
    # max_batch_size: RECEIVE_BATCH_SIZE (10), but never more than the receive asked for;
    # a demand is first asked in a probe (a one-batch call), then in long calls ('5s')
    assert call.sql == RECEIVE_USERTASKS.format(n=1, d="1ms")
    single = call.request.transaction.single_use
    assert single.read_only.strong and "read_write" not in single
    assert message.key == (1, "a") and message.lease_token
    assert message.lease_expires_at > timezone.now()


def test_receive_returns_promptly_when_nothing_is_due(front) -> None:
    started = timezone.now()
    assert api.receive(UserTasks, max_messages=3) == []
    assert timezone.now() - started < timedelta(seconds=5)


def test_receive_restarts_the_stream_when_it_ends(front) -> None:
    api.receive(UserTasks)
    front.end_streams()  # as when max_duration elapses
    # (no new call while nobody receives: the next receive opens one)
    UserTasks.send(user_id=1, message_id="after", payload="")
    assert wait_until(lambda: api.receive(UserTasks))[0].key == (1, "after")
    assert len(front.sql("RECEIVE_")) >= 2


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED])
def test_receive_survives_stream_errors(front, code) -> None:
    front.fail("ExecuteStreamingSql", code, "injected", sql_contains="RECEIVE_", times=2)
    UserTasks.send(user_id=1, message_id="a", payload="x")
    assert wait_until(lambda: api.receive(UserTasks))[0].key == (1, "a")
    assert len(front.sql("RECEIVE_")) >= 3


def test_receive_skips_rows_whose_lease_already_expired(front) -> None:
    past = (timezone.now() - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    future = (timezone.now() + timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    payload = base64.b64encode(b"p").decode()
    front.script(
        "RECEIVE_testapp_usertasks",
        [
            ["1", "stale", payload, past, "t-old", past, False],
            ["1", "fresh", payload, past, "t-new", future, True],
        ],
    )
    got = api.receive(UserTasks, max_messages=5)
    assert [(m.key, m.lease_token) for m in got] == [((1, "fresh"), "t-new")]


def test_renew_is_one_renewlease_call_with_all_tokens(front) -> None:
    UserTasks.send_many([{"user_id": 1, "message_id": m, "payload": ""} for m in "ab"])
    # (both: a stream may hand the second over in a later receive, on a loaded machine)
    batch = receive_due(UserTasks, 2, max_messages=2)
    renewed = api.renew_many(batch)
    [call] = front.sql("RENEWLEASE_")
    # Google's documented array literal, one STRING parameter per token (as Go's
    # ``lease_tokens => [@token1]``), not one undocumented ARRAY<STRING> parameter.
    assert call.sql == (
        "SELECT SpannerOldLeaseToken, SpannerNewLeaseToken, SpannerLeaseExpirationTimestamp "
        "FROM RENEWLEASE_testapp_usertasks(lease_tokens => [@p0, @p1])"
    )
    assert params(call.request) == {"p0": batch[0].lease_token, "p1": batch[1].lease_token}
    assert {t.code.name for t in call.request.param_types.values()} == {"STRING"}
    assert call.request.transaction.single_use.read_only.strong
    assert {m.key for m in renewed} == {m.key for m in batch}
    assert not {m.lease_token for m in renewed} & {m.lease_token for m in batch}  # rotated


def test_postgresql_dialect_receive_and_renew_on_the_wire(front) -> None:
    """PostgreSQL spelling: RECEIVE with all three arguments (``priority => NULL``), and
    RENEWLEASE with ``ARRAY[$1, $2]`` where ``$n`` binds the parameter named ``pn``."""
    from spanner_queues.conf import parse_engine
    from spanner_queues.engines.native import NativeQueueEngine

    pg = NativeQueueEngine(
        parse_engine(
            "pg",
            {
                "ENGINE": "native",
                "OPTIONS": {
                    "DIALECT": "postgresql",
                    "RECEIVE_MAX_DURATION_SECONDS": 5,
                    "RECEIVE_BATCH_SIZE": 10,
                },
            },
        )
    )
    try:
        UserTasks.send_many([{"user_id": 1, "message_id": m, "payload": "p"} for m in "ab"])
        batch = wait_until(lambda: pg.receive(UserTasks, max_messages=2))
        call = next(r for r in front.sql("spanner.receive_") if r.method == "ExecuteStreamingSql")
        assert call.sql == (  # (a probe first: a one-batch call)
            "SELECT user_id, message_id, payload, deliver_time, spanner_lease_token, "
            "spanner_lease_expiration_timestamp, spanner_last_batch_message FROM "
            "spanner.receive_testapp_usertasks(max_batch_size => 2, priority => NULL, "
            "max_duration => '1ms')"
        )
        if len(batch) < 2:
            batch += wait_until(lambda: pg.receive(UserTasks))
        renewed = pg.renew_leases(UserTasks, batch)
        [renew] = front.sql("spanner.renewlease_")
        assert renew.sql == (
            "SELECT spanner_old_lease_token, spanner_new_lease_token, "
            "spanner_lease_expiration_timestamp FROM "
            "spanner.renewlease_testapp_usertasks(lease_tokens => ARRAY[$1, $2])"
        )
        assert params(renew.request) == {"p1": batch[0].lease_token, "p2": batch[1].lease_token}
        assert {m.key for m in renewed} == {(1, "a"), (1, "b")}
        assert not {m.lease_token for m in renewed} & {m.lease_token for m in batch}
    finally:
        front.end_streams()
        pg.stop_receiving(wait=5)


def test_renew_null_new_token_or_missing_row_means_lease_lost(front) -> None:
    UserTasks.send_many([{"user_id": 1, "message_id": m, "payload": ""} for m in "abc"])
    a, b, c = sorted(wait_until(lambda: api.receive(UserTasks, max_messages=3)), key=str)
    later = (timezone.now() + timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    front.script(
        "RENEWLEASE_",
        [[a.lease_token, "a2", later], [b.lease_token, None, None]],  # c: no row
    )
    renewed = api.renew_many([a, b, c])
    assert [(m.key, m.lease_token) for m in renewed] == [(a.key, "a2")]
    front.script("RENEWLEASE_", [])
    with pytest.raises(LeaseLost):
        api.renew(a)


def test_renew_of_an_acked_message_returns_a_null_token(front) -> None:
    UserTasks.send(user_id=1, message_id="a", payload="")
    [message] = api.receive(UserTasks)
    api.ack(message)
    assert api.renew_many([message]) == []


def test_ack_is_delete_assert_rows_modified_in_the_callers_transaction(front) -> None:
    UserTasks.send(user_id=3, message_id="m", payload="")
    [message] = api.receive(UserTasks)
    front.clear()
    with transaction.atomic():
        Account.objects.create(name="work")
        api.ack(message)
    [delete] = front.sql("DELETE FROM testapp_usertasks")
    assert delete.sql == (
        "DELETE FROM testapp_usertasks WHERE user_id = @a0 AND message_id = @a1 "
        "ASSERT_ROWS_MODIFIED 1"
    )
    assert params(delete.request) == {"a0": "3", "a1": "m"}
    assert delete.request.transaction.id  # inside the read-write transaction, not begun by it
    assert [r.method for r in front.requests() if r.method in ("Commit", "Rollback")] == ["Commit"]


def test_out_of_range_ack_rolls_back_and_is_not_retried(front) -> None:
    UserTasks.send(user_id=1, message_id="gone", payload="")
    [message] = api.receive(UserTasks)
    api.ack(message)
    front.clear()
    with pytest.raises(MessageAlreadyAcked), transaction.atomic():
        Account.objects.create(name="duplicate")
        api.ack(message)
    assert 1 <= len(front.sql("DELETE FROM testapp_usertasks")) <= 2  # DB-API inline-begin
    assert [r.method for r in front.requests() if r.method in ("Commit", "Rollback")] == [
        "Rollback"
    ]
    assert not Account.objects.exists()


def test_out_of_range_cannot_be_caught_and_continued(front) -> None:
    UserTasks.send(user_id=1, message_id="gone", payload="")
    [message] = api.receive(UserTasks)
    api.ack(message)
    with transaction.atomic():
        Account.objects.create(name="must not commit")
        with pytest.raises(MessageAlreadyAcked):
            api.ack(message)
        assert transaction.get_rollback()
    assert not Account.objects.exists()


def test_send_mutations(front) -> None:
    later = timezone.now() + timedelta(minutes=5)
    messages = [
        api.build_message(UserTasks, {"user_id": 1, "message_id": "m1", "payload": b"\x01"}),
        api.build_message(
            UserTasks, {"user_id": 1, "message_id": "m2", "payload": "t", "deliver_time": later}
        ),
    ]
    engine().send_mutations(UserTasks, messages)
    [commit] = front.commits()
    assert commit.transaction_id  # a read-write transaction: its commit is safe to retry
    first, second = (m.send for m in commit.mutations)
    assert first.queue == "testapp_usertasks" and list(first.key) == ["1", "m1"]
    assert first.payload == base64.b64encode(b"\x01").decode()
    assert "deliver_time" not in first
    assert second.deliver_time.timestamp() == pytest.approx(later.timestamp(), abs=1e-3)
    assert UserTasks.objects.count() == 2


def test_ack_mutations_not_found_and_ignore_not_found(front) -> None:
    UserTasks.send(user_id=1, message_id="a", payload="")
    engine().ack_mutations(UserTasks, [(1, "a")])
    [commit] = front.commits()[-1:]
    [ack] = [m.ack for m in commit.mutations]
    assert ack.queue == "testapp_usertasks" and list(ack.key) == ["1", "a"]
    assert not ack.ignore_not_found
    with pytest.raises(MessageAlreadyAcked):
        engine().ack_mutations(UserTasks, [(1, "a")])  # NOT_FOUND: Message not found
    engine().ack_mutations(UserTasks, [(1, "a")], ignore_not_found=True)
    assert front.commits()[-1].mutations[0].ack.ignore_not_found


def test_aborted_commit_is_replayed_by_spanner_dbapi(front) -> None:
    """Pins the DB-API's replay, not our runner: spanner_dbapi's Connection.commit replays the
    transaction on ABORTED, so the runner's own retry loop is not reached here."""
    from spanner_queues.transactions import run_in_transaction

    front.fail("Commit", grpc.StatusCode.ABORTED, "Transaction was aborted")
    run_in_transaction(
        lambda: UserTasks.send(user_id=5, message_id="x", payload=""), using="default"
    )
    assert UserTasks.objects.filter(user_id=5).count() == 1


def test_orm_reads_never_select_bookkeeping_columns(front) -> None:
    UserTasks.send(user_id=1, message_id="a", payload="x")
    row = UserTasks.objects.get(pk=(1, "a"))
    assert row.as_message().key == (1, "a")
    selects = [r.sql for r in front.sql("FROM testapp_usertasks") if r.sql.startswith("SELECT")]
    assert selects and not any("send_time" in s or "lease_token" in s for s in selects)


def test_stats_query(front) -> None:
    engine().stats(UserTasks)
    [call] = front.sql("COUNT(*)")
    assert call.sql == (
        "SELECT COUNT(*), SUM(CASE WHEN DeliverTime <= CURRENT_TIMESTAMP() THEN 1 ELSE 0 END), "
        "MIN(DeliverTime) FROM testapp_usertasks"
    )
    assert call.request.transaction.single_use.read_only.strong


@pytest.mark.parametrize("table_type", ["QUEUE", "BASE TABLE"])
def test_introspection_reports_queues_as_non_tables(front, table_type) -> None:
    # Spanner's TABLE_TYPE for queues is undocumented: the front shows "BASE TABLE" (its queues
    # are tables); "QUEUE" is scripted as the answer to the introspection's query for other types
    if table_type == "QUEUE":
        for _ in range(2):  # table_names(), then get_table_list()
            front.script(
                "t.table_type NOT IN ('BASE TABLE', 'VIEW')",
                [["testapp_usertasks"], ["testapp_uploadtasks"]],
            )
    names = connection.introspection.table_names()
    assert "testapp_account" in names
    assert not {"testapp_usertasks", "testapp_uploadtasks"} & set(names)
    with connection.cursor() as cursor:
        infos = {i.name: i.type for i in connection.introspection.get_table_list(cursor)}
    assert infos["testapp_usertasks"] == "q"
    if table_type == "QUEUE":
        assert len(front.sql("t.table_type NOT IN")) == 2  # both answered by the script


def test_flush_does_not_touch_queues(front) -> None:
    UserTasks.send(user_id=1, message_id="kept", payload="")
    front.clear()
    call_command("flush", interactive=False, verbosity=0)
    assert not front.sql("DELETE FROM testapp_usertasks")
    assert front.sql("DELETE FROM testapp_account")
    assert UserTasks.objects.count() == 1


def test_interleaved_queue_needs_its_parent(front) -> None:
    from tests.testapp.models import Upload

    upload = Upload.objects.create(name="u")
    UploadTasks.send(upload=upload.pk, message_id="m", payload="")
    [insert] = front.sql("INSERT INTO testapp_uploadtasks")
    assert insert.sql.startswith("INSERT INTO testapp_uploadtasks (id, message_id, Payload)")


def test_purge_reads_the_keys_and_deletes_them_by_key_never_where_true(front) -> None:
    """Google documents deletes of queue messages by key only; the front refuses
    ``DELETE ... WHERE true`` on a queue."""
    UserTasks.send_many([{"user_id": 1, "message_id": m, "payload": ""} for m in "abc"])
    front.record()
    engine().purge(UserTasks)
    assert not UserTasks.objects.exists()
    sent = [r.sql for r in front.requests() if r.sql and "testapp_usertasks" in r.sql]
    for r in front.requests():  # (the DB-API sends DML in ExecuteBatchDml)
        sent += [s.sql for s in getattr(r.request, "statements", [])]
    assert "SELECT user_id, message_id FROM testapp_usertasks" in sent
    [delete] = [sql for sql in sent if sql.startswith("DELETE")]
    assert delete == (
        "DELETE FROM testapp_usertasks WHERE (user_id, message_id) IN "
        "((@a0, @a1), (@a2, @a3), (@a4, @a5))"
    ), delete
    engine().purge(UserTasks)  # an empty queue: one read, no delete

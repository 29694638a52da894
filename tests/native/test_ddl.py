"""DDL and SQL text in both dialects from one declaration, and the E007 check."""

from __future__ import annotations

import pytest

from spanner_queues.engines.spanner_ddl import GoogleSQL, KeyColumn, PostgreSQL, QueueDeclaration
from spanner_queues.exceptions import QueueConfigurationError

DECL = QueueDeclaration(
    name="usertasks",
    keys=(KeyColumn("userid", "BigIntegerField"), KeyColumn("messageid", "CharField", 36)),
    parent="users",
)


def test_googlesql_create_queue_with_options() -> None:
    decl = QueueDeclaration(
        name="Q1",
        keys=(KeyColumn("Id", "IntegerField"),),
        options={"receive_mode": "PULL", "disable_send": False},
    )
    assert GoogleSQL().create_queue(decl) == (
        "CREATE QUEUE Q1 (\n  Id INT64 NOT NULL,\n  Payload BYTES(MAX) NOT NULL\n) "
        "PRIMARY KEY (Id), OPTIONS (receive_mode = 'PULL', disable_send = false)"
    )


def test_postgresql_spelling() -> None:
    pg = PostgreSQL()
    assert pg.create_queue(DECL) == (
        "CREATE QUEUE usertasks (\n  userid bigint NOT NULL,\n  messageid varchar(36) NOT NULL,"
        "\n  payload bytea NOT NULL,\n  PRIMARY KEY (userid, messageid)\n) "
        "INTERLEAVE IN PARENT users ON DELETE CASCADE"
    )
    assert pg.receive(DECL, max_batch_size=50, max_duration="20m") == (
        "SELECT userid, messageid, payload, deliver_time, spanner_lease_token, "
        "spanner_lease_expiration_timestamp, spanner_last_batch_message FROM "
        "spanner.receive_usertasks(max_batch_size => 50, priority => NULL, max_duration => '20m')"
    )
    assert pg.receive(DECL, max_batch_size=None, max_duration="20m").endswith(
        "(max_batch_size => NULL, priority => NULL, max_duration => '20m')"
    )
    assert pg.renew(DECL, 2) == (
        "SELECT spanner_old_lease_token, spanner_new_lease_token, "
        "spanner_lease_expiration_timestamp FROM "
        "spanner.renewlease_usertasks(lease_tokens => ARRAY[$1, $2])"
    )
    # In the PostgreSQL dialect, $1 binds the parameter named p1.
    assert pg.renew_params(["t1", "t2"]) == {"p1": "t1", "p2": "t2"}
    assert pg.ack(DECL) == (
        "DELETE FROM usertasks WHERE userid = $1 AND messageid = $2 ASSERT_ROWS_MODIFIED 1"
    )
    assert pg.insert(DECL, 1, with_deliver_time=True) == (
        "INSERT INTO usertasks (userid, messageid, payload, deliver_time) VALUES ($1, $2, $3, $4)"
    )
    assert pg.drop_queue(DECL) == "DROP QUEUE usertasks"
    with pytest.raises(QueueConfigurationError, match="OPTIONS"):
        pg.create_queue(QueueDeclaration("q", DECL.keys, options={"receive_mode": "PULL"}))


def test_googlesql_renewlease_passes_the_documented_array_literal() -> None:
    sql = GoogleSQL()
    assert sql.renew(DECL, 3) == (
        "SELECT SpannerOldLeaseToken, SpannerNewLeaseToken, SpannerLeaseExpirationTimestamp "
        "FROM RENEWLEASE_usertasks(lease_tokens => [@p0, @p1, @p2])"
    )
    assert sql.renew_params(["a", "b", "c"]) == {"p0": "a", "p1": "b", "p2": "c"}
    assert sql.receive(DECL, max_batch_size=None, max_duration="20m").endswith(
        "FROM RECEIVE_usertasks(max_duration => '20m')"
    )
    with pytest.raises(QueueConfigurationError):
        sql.renew(DECL, 0)


def test_googlesql_interleave_and_quoting() -> None:
    decl = QueueDeclaration("Order", (KeyColumn("select", "IntegerField"),), parent="Users")
    assert GoogleSQL().create_queue(decl) == (
        "CREATE QUEUE `Order` (\n  `select` INT64 NOT NULL,\n  Payload BYTES(MAX) NOT NULL\n) "
        "PRIMARY KEY (`select`), INTERLEAVE IN PARENT Users ON DELETE CASCADE"
    )


def test_bad_receive_arguments_are_refused() -> None:
    with pytest.raises(QueueConfigurationError):
        GoogleSQL().receive(DECL, max_batch_size=0, max_duration="20m")
    with pytest.raises(QueueConfigurationError):
        GoogleSQL().receive(DECL, max_batch_size=1, max_duration="20 minutes; DROP")


def test_e007_explains_sqlite_and_the_emulator(monkeypatch) -> None:
    from django.db import connections

    from spanner_queues.drivers import SpannerDriver, SQLiteDriver
    from spanner_queues.engines import engines, native

    engine = engines["default"]
    assert engine.check() == []  # django_spanner on the front (queues, as on real Spanner): fine
    monkeypatch.setattr(native, "driver_for", lambda alias: SQLiteDriver(connections[alias]))
    [error] = engine.check()
    assert error.id == "spanner_queues.E007" and "SQLite has no queues" in error.msg
    monkeypatch.setenv("SPANNER_EMULATOR_HOST", "localhost:9010")
    monkeypatch.setattr(native, "driver_for", lambda alias: SpannerDriver(connections[alias]))
    [error] = engine.check()
    assert "emulator" in error.msg and "#383" in error.msg and "'table'" in error.hint


def test_row_deletion_policy_is_its_own_clause_in_both_dialects() -> None:
    from spanner_queues.options import RowDeletion

    decl = QueueDeclaration(
        name="usertasks",
        keys=DECL.keys,
        parent="users",
        options={"receive_mode": "PULL"},
        row_deletion=RowDeletion(column=None, days=7),
    )
    # After the key and interleave clauses, before OPTIONS; never an OPTIONS key.
    assert (
        GoogleSQL()
        .create_queue(decl)
        .endswith(
            ") PRIMARY KEY (userid, messageid), INTERLEAVE IN PARENT users ON DELETE CASCADE, "
            "ROW DELETION POLICY (OLDER_THAN(DeliverTime, INTERVAL 7 DAY)), "
            "OPTIONS (receive_mode = 'PULL')"
        )
    )
    pg_decl = QueueDeclaration(
        "usertasks", DECL.keys, parent="users", row_deletion=RowDeletion("created_at", 0)
    )
    assert (
        PostgreSQL()
        .create_queue(pg_decl)
        .endswith(
            "\n) INTERLEAVE IN PARENT users ON DELETE CASCADE TTL INTERVAL '0 days' ON created_at"
        )
    )
    assert (
        PostgreSQL()
        .create_queue(QueueDeclaration("q", DECL.keys, row_deletion=RowDeletion(None, 1)))
        .endswith("\n) TTL INTERVAL '1 days' ON deliver_time")
    )


def test_declare_reads_row_deletion_policy_from_queue_meta() -> None:
    from django.db import models
    from django.test.utils import isolate_apps

    from spanner_queues.engines.spanner_ddl import declare
    from spanner_queues.models import Queue
    from spanner_queues.options import RowDeletion, queue_options

    with isolate_apps("tests.testapp"):

        class Beats(Queue):
            Meta = type("Meta", (), {"app_label": "testapp"})
            worker = models.CharField(max_length=20, primary_key=True)

            class QueueMeta:
                row_deletion_policy = {"older_than": "deliver_time", "days": 3}

        class Stamped(Queue):
            Meta = type("Meta", (), {"app_label": "testapp"})
            at = models.DateTimeField()
            n = models.IntegerField()
            pk = models.CompositePrimaryKey("at", "n")

            class QueueMeta:
                row_deletion_policy = {"older_than": "at", "days": 30}

        assert declare(Beats, queue_options(Beats)).row_deletion == RowDeletion(None, 3)
        assert declare(Stamped, queue_options(Stamped)).row_deletion == RowDeletion("at", 30)
        assert "ROW DELETION POLICY (OLDER_THAN(DeliverTime, INTERVAL 3 DAY))" in (
            GoogleSQL().create_queue(declare(Beats, queue_options(Beats)))
        )


def test_payload_types_in_both_dialects() -> None:
    for payload_type, google, pg in [
        ("bytes", "Payload BYTES(MAX) NOT NULL", "payload bytea NOT NULL"),
        ("string", "Payload STRING(MAX) NOT NULL", "payload text NOT NULL"),
        ("json", "Payload JSON NOT NULL", "payload jsonb NOT NULL"),
    ]:
        decl = QueueDeclaration("q", DECL.keys, payload_type=payload_type)
        assert f"\n  {google}\n)" in GoogleSQL().create_queue(decl)
        assert f"\n  {pg},\n  PRIMARY KEY" in PostgreSQL().create_queue(decl)
    json_decl = QueueDeclaration("q", DECL.keys, payload_type="json")
    assert GoogleSQL().insert(json_decl, 1, with_deliver_time=False) == (
        "INSERT INTO q (userid, messageid, Payload) "
        "VALUES (@p0, @p1, PARSE_JSON(@p2, wide_number_mode=>'round'))"
    )
    assert PostgreSQL().insert(json_decl, 1, with_deliver_time=False) == (
        "INSERT INTO q (userid, messageid, payload) VALUES ($1, $2, CAST($3 AS jsonb))"
    )


def test_batch_ack_is_one_delete_asserting_every_row_in_both_dialects() -> None:
    single = QueueDeclaration(name="jobs", keys=(KeyColumn("id", "CharField", 64),))
    assert GoogleSQL().ack_many(single, 1) == GoogleSQL().ack(single)
    assert GoogleSQL().ack_many(single, 3) == (
        "DELETE FROM jobs WHERE id IN (@k0, @k1, @k2) ASSERT_ROWS_MODIFIED 3"
    )
    assert GoogleSQL().ack_many(DECL, 2) == (
        "DELETE FROM usertasks WHERE (userid, messageid) IN ((@k0, @k1), (@k2, @k3)) "
        "ASSERT_ROWS_MODIFIED 2"
    )
    assert PostgreSQL().ack_many(DECL, 2) == (
        "DELETE FROM usertasks WHERE (userid, messageid) IN (($1, $2), ($3, $4)) "
        "ASSERT_ROWS_MODIFIED 2"
    )
    assert GoogleSQL(paramstyle="format").ack_many(single, 2) == (
        "DELETE FROM jobs WHERE id IN (%s, %s) ASSERT_ROWS_MODIFIED 2"
    )


def test_no_statement_binds_more_than_950_parameters() -> None:
    single = QueueDeclaration(name="jobs", keys=(KeyColumn("id", "CharField", 64),))
    GoogleSQL().ack_many(single, 950)
    with pytest.raises(QueueConfigurationError, match="950"):
        GoogleSQL().ack_many(DECL, 476)  # 952 key values
    GoogleSQL().renew(DECL, 950)
    with pytest.raises(QueueConfigurationError, match="950"):
        GoogleSQL().renew(DECL, 951)
    assert GoogleSQL().insert_width(DECL, with_deliver_time=True) == 4

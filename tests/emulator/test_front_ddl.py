"""Queue DDL on the front: CREATE/DROP/ALTER QUEUE, GetDatabaseDdl, what a queue looks like."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions as gexc

from tests.emulator.conftest import Q1, SAMPLE_QUEUE, USER_TASKS


def ddl(database: Any) -> list[str]:
    database.reload()
    return list(database.ddl_statements)


def test_get_database_ddl_shows_queues_as_declared(database: Any) -> None:
    statements = ddl(database)
    assert USER_TASKS in statements and Q1 in statements and SAMPLE_QUEUE in statements
    assert not any("SpannerQueue" in s for s in statements)  # bookkeeping never shows


def test_update_ddl_creates_every_payload_type_and_drops(database: Any) -> None:
    database.update_ddl(
        [
            "CREATE QUEUE JsonQ (Id STRING(36) NOT NULL, Payload JSON NOT NULL) PRIMARY KEY (Id)",
            "CREATE QUEUE IF NOT EXISTS TextQ (Id INT64 NOT NULL, Payload STRING(1024) NOT NULL) "
            "PRIMARY KEY (Id DESC), ROW DELETION POLICY (OLDER_THAN(DeliverTime, INTERVAL 7 DAY))",
        ]
    ).result(60)
    statements = ddl(database)
    assert any(s.startswith("CREATE QUEUE JsonQ") for s in statements)
    assert any("ROW DELETION POLICY" in s and "TextQ" in s for s in statements)
    database.run_in_transaction(
        lambda t: t.execute_update(
            "INSERT INTO JsonQ (Id, Payload) VALUES ('a', JSON '{\"n\": 1}')"
        )
    )
    with database.snapshot() as snap:
        [[payload]] = list(snap.execute_sql("SELECT Payload FROM JsonQ"))
    assert dict(payload) == {"n": 1}
    database.update_ddl(["DROP QUEUE JsonQ", "DROP QUEUE IF EXISTS TextQ"]).result(60)
    assert not any("JsonQ" in s or "TextQ" in s for s in ddl(database))


def test_alter_queue_set_options_is_kept(database: Any) -> None:
    database.update_ddl(["ALTER QUEUE Q1 SET OPTIONS (disable_delivery = true)"]).result(60)
    [q1] = [s for s in ddl(database) if s.startswith("CREATE QUEUE Q1")]
    assert "OPTIONS (disable_delivery = true)" in q1


def test_select_star_shows_keys_payload_and_deliver_time(database: Any) -> None:
    database.run_in_transaction(
        lambda t: t.execute_update("INSERT INTO SampleQueue (Id, Payload) VALUES (1, 'hi')")
    )
    with database.snapshot() as snap:
        result = snap.execute_sql("SELECT * FROM SampleQueue")
        rows = list(result)
        names = [f.name for f in result.fields]
    assert names == ["Id", "Payload", "DeliverTime"]
    assert rows[0][:2] == [1, "hi"]


@pytest.mark.parametrize(
    ("statement", "says"),
    [
        ("CREATE QUEUE NoPayload (Id INT64 NOT NULL) PRIMARY KEY (Id)", "no Payload"),
        (
            "CREATE QUEUE BadPayload (Id INT64 NOT NULL, Payload INT64 NOT NULL) PRIMARY KEY (Id)",
            "Payload must be",
        ),
        (
            "CREATE QUEUE Extra (Id INT64 NOT NULL, Note STRING(10), Payload BYTES(MAX) NOT NULL) "
            "PRIMARY KEY (Id)",
            "primary key",
        ),
    ],
)
def test_bad_queue_ddl_is_invalid_argument(database: Any, statement: str, says: str) -> None:
    with pytest.raises(gexc.InvalidArgument, match=says):
        database.update_ddl([statement]).result(60)


def test_create_database_with_queue_in_extra_statements(database: Any) -> None:
    # The ``database`` fixture itself is created that way; its queues are usable at once.
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="Hello")
    with database.snapshot() as snap:
        assert list(snap.execute_sql("SELECT Id, Payload FROM SampleQueue")) == [[1, "Hello"]]

"""The front as strict as Spanner (issue 20, items 8 and 13): writes a queue does not take,
RENEWLEASE rows as Google shows them, statements told apart from string literals, RECEIVE
checked before it leases, quoted queue names, DDL that fails changing nothing, and bad
arguments answered INVALID_ARGUMENT."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.protobuf.struct_pb2 import Value

from spanner_queues_emulator.queues import make_token
from tests.emulator.test_front_ddl import ddl
from tests.emulator.test_front_messages import leased, receive, renew

UTC = timezone.utc
RECEIVE_ID = "SELECT Id FROM RECEIVE_SampleQueue(max_batch_size => 10, max_duration => '1s')"


def payloads(database: Any) -> list[list[Any]]:
    with database.snapshot() as snap:
        return list(snap.execute_sql("SELECT Id, Payload FROM SampleQueue ORDER BY Id"))


# --- item 8: writes a queue does not take ----------------------------------------------------
@pytest.mark.parametrize(
    "statement",
    [
        "INSERT OR UPDATE INTO SampleQueue (Id, Payload) VALUES (1, 'changed')",
        "INSERT OR UPDATE SampleQueue (Id, Payload) VALUES (1, 'changed')",
        "insert or update into `SampleQueue` (Id, Payload) VALUES (1, 'changed')",
        "INSERT OR IGNORE INTO SampleQueue (Id, Payload) VALUES (1, 'changed')",
        "/* hint */ INSERT OR UPDATE INTO SampleQueue (Id, Payload) VALUES (1, 'changed') "
        "THEN RETURN Id",
        "UPDATE `SampleQueue` SET Payload = 'changed' WHERE Id = 1",
    ],
)
def test_insert_or_update_and_update_dml_on_a_queue_are_refused(
    database: Any, statement: str
) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="v1")
    with pytest.raises(gexc.InvalidArgument, match="is not supported on queue SampleQueue"):
        database.run_in_transaction(lambda t: t.execute_update(statement))
    with pytest.raises(gexc.InvalidArgument, match="is not supported on queue SampleQueue"):
        database.run_in_transaction(lambda t: t.batch_update([statement]))
    assert payloads(database) == [[1, "v1"]]


def test_insert_or_update_of_a_table_still_works(database: Any) -> None:
    upsert = "INSERT OR UPDATE INTO Users (UserId, Name) VALUES (1, 'ada')"
    assert database.run_in_transaction(lambda t: t.execute_update(upsert)) == 1


@pytest.mark.parametrize("op", ["insert", "update", "insert_or_update", "replace"])
def test_write_mutations_on_a_queue_are_refused(database: Any, op: str) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="v1")
    with pytest.raises(gexc.InvalidArgument, match="not supported on queue SampleQueue"):
        with database.batch() as batch:
            getattr(batch, op)(table="SampleQueue", columns=("Id", "Payload"), values=[(1, "x")])
    assert payloads(database) == [[1, "v1"]]


def test_renewlease_row_for_an_unrenewable_token_has_its_lease_expiry(database: Any) -> None:
    _, token, expires = leased(database)
    with database.batch() as batch:
        batch.ack(queue="SampleQueue", key=(1,))
    [[old, new, expiry]] = renew(
        database, "SELECT * FROM RENEWLEASE_SampleQueue(lease_tokens => [@t])", t=token
    )
    assert (old, new) == (token, None)
    assert expiry is not None
    assert expiry == expires  # the lease the token still holds, not NULL


# --- item 13 (c): string literals and comments are not calls --------------------------------
def test_a_string_literal_naming_a_queue_function_is_only_a_string(database: Any) -> None:
    text = "see SELECT * FROM RECEIVE_SampleQueue( and RENEWLEASE_SampleQueue(["
    database.run_in_transaction(
        lambda t: t.execute_update(
            f"INSERT INTO SampleQueue (Id, Payload) VALUES (1, '{text}') "
            "-- RECEIVE_SampleQueue( in a comment"
        )
    )
    database.run_in_transaction(
        lambda t: t.batch_update(
            [f'INSERT INTO SampleQueue (Id, Payload) VALUES (2, """{text}""")']
        )
    )
    assert payloads(database) == [[1, text], [2, text]]
    with database.snapshot() as snap:  # a streamed query, as the client sends every query
        rows = list(snap.execute_sql("SELECT 'RECEIVE_SampleQueue(' /* RENEWLEASE_Q1( */"))
    assert rows == [["RECEIVE_SampleQueue("]]


# --- item 13 (d): RECEIVE is checked before it leases ---------------------------------------
def test_receive_of_an_unknown_column_fails_before_leasing(database: Any) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="x")
    with pytest.raises(gexc.InvalidArgument, match="Unrecognized name: Nope"):
        receive(database, "SELECT Id, Nope FROM RECEIVE_SampleQueue(max_duration => '1s')")
    assert receive(database, RECEIVE_ID) == [[1]]  # not leased by the refused call


@pytest.mark.parametrize("duration", ["99999999999h", "100000000000000000000000ms"])
def test_an_absurd_max_duration_is_invalid_argument(database: Any, duration: str) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="x")
    with pytest.raises(gexc.InvalidArgument, match="max_duration"):
        receive(database, f"SELECT Id FROM RECEIVE_SampleQueue(max_duration => '{duration}')")
    assert receive(database, RECEIVE_ID) == [[1]]


# --- item 13 (e): quoted queue names ---------------------------------------------------------
def test_quoted_queue_names_work_end_to_end(database: Any) -> None:
    order = (
        "CREATE QUEUE `Order` (Id INT64 NOT NULL, Payload STRING(MAX) NOT NULL) PRIMARY KEY (Id)"
    )
    dashed = (
        "CREATE QUEUE `my-q` (`Key` STRING(36) NOT NULL, Payload STRING(MAX) NOT NULL) "
        "PRIMARY KEY (`Key`)"
    )
    database.update_ddl([order, dashed]).result(60)
    statements = ddl(database)
    assert order in statements and dashed in statements
    with database.batch() as batch:
        batch.send(queue="Order", key=(1,), payload="one")
    database.run_in_transaction(
        lambda t: t.execute_update("INSERT INTO `my-q` (`Key`, Payload) VALUES ('a', 'two')")
    )
    [[one, _]] = receive(
        database,
        "SELECT Id, SpannerLeaseToken FROM RECEIVE_Order(max_duration => '1s')",
    )
    [[key, token]] = receive(
        database,
        "SELECT `Key`, SpannerLeaseToken FROM `RECEIVE_my-q`(max_duration => '1s')",
    )
    assert (one, key) == (1, "a")
    [[old, new, _]] = renew(database, "SELECT * FROM `RENEWLEASE_my-q`([@t])", t=token)
    assert old == token and new not in (None, token)
    with database.batch() as batch:
        batch.ack(queue="Order", key=(1,))
        batch.ack(queue="my-q", key=("a",))
    database.update_ddl(["DROP QUEUE `Order`", "DROP QUEUE IF EXISTS `my-q`"]).result(60)
    assert not any("Order" in s or "my-q" in s for s in ddl(database))


# --- item 13 (f): DDL the emulator refuses changes nothing ----------------------------------
@pytest.mark.parametrize(
    "statements",
    [
        # a second SampleQueue: "Duplicate name in schema"
        [
            "CREATE QUEUE SampleQueue (Id STRING(36) NOT NULL, Payload BYTES(MAX) NOT NULL) "
            "PRIMARY KEY (Id)"
        ],
        # the batch fails at its second statement (Users exists)
        [
            "ALTER QUEUE Q1 SET OPTIONS (disable_delivery = true)",
            "CREATE TABLE Users (UserId INT64 NOT NULL) PRIMARY KEY (UserId)",
        ],
        [
            "DROP QUEUE SampleQueue",
            "CREATE TABLE Users (UserId INT64 NOT NULL) PRIMARY KEY (UserId)",
        ],
    ],
)
def test_refused_queue_ddl_leaves_get_database_ddl_unchanged(
    database: Any, statements: list[str]
) -> None:
    before = ddl(database)
    with pytest.raises(gexc.GoogleAPICallError):
        database.update_ddl(statements).result(60)
    assert ddl(database) == before


# --- item 13 (g): one malformed token does not fail a RENEWLEASE ----------------------------
def forged(body: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(body).encode()).decode()


def test_a_malformed_token_gets_no_row_and_the_others_renew(database: Any) -> None:
    _, token, _ = leased(database)
    later = (datetime.now(UTC) + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    bad = [
        forged({"q": "SAMPLEQUEUE", "k": ["not-a-number"], "e": later, "n": "00"}),
        forged({"q": "SAMPLEQUEUE", "k": ["1", "2"], "e": later, "n": "00"}),
        forged({"q": "SAMPLEQUEUE", "k": {"x": 1}, "e": later, "n": "00"}),
        forged({"q": "SAMPLEQUEUE", "k": ["1"], "e": "tomorrow", "n": "00"}),
        "",
        # minted as the front mints tokens, but with keys that do not fit SampleQueue (INT64)
        make_token("SampleQueue", [Value(string_value="x")], datetime.now(UTC) + timedelta(30)),
        make_token("SampleQueue", [Value(number_value=1)], datetime.now(UTC) + timedelta(30)),
        make_token(
            "SampleQueue", [Value(string_value=str(2**64))], datetime.now(UTC) + timedelta(30)
        ),
    ]
    rows = renew(
        database,
        "SELECT * FROM RENEWLEASE_SampleQueue(lease_tokens => @tokens)",
        tokens=[*bad, token],
    )
    [[old, new, _]] = rows
    assert old == token and new not in (None, token)


# --- DML Google never shows on a queue -------------------------------------------------------
@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO SampleQueue (Id, Payload) VALUES (2, 'x') THEN RETURN Id",
        "DELETE FROM SampleQueue WHERE Id = 1 THEN RETURN Payload",
        "INSERT INTO SampleQueue (Id, Payload) SELECT UserId, Name FROM Users",
        "INSERT SampleQueue (Id, Payload) (SELECT 2, 'x')",
        "DELETE FROM SampleQueue WHERE true",
        "DELETE SampleQueue WHERE Payload = 'v1'",
        "DELETE FROM `SampleQueue` WHERE 1 = 1 /* Id = 1 */",
    ],
)
def test_undocumented_dml_on_a_queue_is_refused(database: Any, statement: str) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="v1")
        batch.insert(table="Users", columns=("UserId", "Name"), values=[(5, "ada")])
    with pytest.raises(gexc.InvalidArgument, match="is not supported on queue SampleQueue"):
        database.run_in_transaction(lambda t: t.execute_update(statement))
    with pytest.raises(gexc.InvalidArgument, match="is not supported on queue SampleQueue"):
        database.run_in_transaction(lambda t: t.batch_update([statement]))
    assert payloads(database) == [[1, "v1"]]


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO SampleQueue (Id, Payload) VALUES (2, 'x')",
        "DELETE FROM SampleQueue WHERE Id = 1 ASSERT_ROWS_MODIFIED 1",
        "DELETE FROM SampleQueue WHERE Id IN (1, 3)",
        "DELETE FROM Users WHERE true",  # a table, not a queue
        "INSERT INTO Users (UserId, Name) SELECT 9, 'x' THEN RETURN UserId",
    ],
)
def test_documented_dml_on_a_queue_and_any_dml_on_a_table_run(
    database: Any, statement: str
) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="v1")
    database.run_in_transaction(lambda t: t.execute_update(statement))

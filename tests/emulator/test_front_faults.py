"""The front's injected faults and request record (``spanner_queues_emulator.faults``), with
google-cloud-spanner as an application uses it: a fault fails the calls it names with the status
it names, before they apply (or, with ``after``, once they have); the record shows what was sent;
``end_streams`` ends open RECEIVE streams."""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
import pytest
from google.api_core import exceptions as gexc

from spanner_queues_emulator.faults import SERVICE
from tests.conftest import wait_until


def query(database: Any, sql: str) -> list[list[Any]]:
    with database.snapshot() as snap:
        return list(snap.execute_sql(sql))


def count(database: Any) -> int:
    return query(database, "SELECT COUNT(*) FROM SampleQueue")[0][0]


def test_a_fault_fails_the_matching_calls_with_its_status_then_is_spent(
    database: Any, control: Any
) -> None:
    control.fail("ExecuteStreamingSql", "PERMISSION_DENIED", "no way", sql_contains="SELECT 2")
    assert query(database, "SELECT 1") == [[1]]  # not matching: served
    with pytest.raises(gexc.PermissionDenied, match="no way"):
        query(database, "SELECT 2")
    assert query(database, "SELECT 2") == [[2]]  # times=1: spent


def test_an_aborted_answer_carries_a_retry_delay_as_spanner_s_do(
    database: Any, control: Any
) -> None:
    """Spanner sends a ``RetryInfo`` trailer with every ABORTED; the client waits what it says
    before it retries (without one, the DB-API waits ``2**attempt`` seconds)."""
    from google.cloud.spanner_v1._helpers import _get_retry_delay

    control.fail("ExecuteStreamingSql", "ABORTED", "aborted", sql_contains="SELECT 3")
    with pytest.raises(gexc.Aborted) as raised:
        query(database, "SELECT 3")
    assert 0 < _get_retry_delay(raised.value.errors[0], 1) < 0.1


def test_times_counts_the_matching_calls(database: Any, control: Any) -> None:
    control.fail("ExecuteStreamingSql", grpc.StatusCode.FAILED_PRECONDITION, times=2)
    for _ in range(2):
        with pytest.raises(gexc.FailedPrecondition, match="injected"):
            query(database, "SELECT 1")
    assert query(database, "SELECT 1") == [[1]]


def test_a_failed_commit_applies_nothing(database: Any, control: Any) -> None:
    control.fail("Commit", "PERMISSION_DENIED", "refused")
    with pytest.raises(gexc.PermissionDenied, match="refused"):
        with database.batch() as batch:
            batch.send(queue="SampleQueue", key=(1,), payload="x")
    assert count(database) == 0


def test_a_failed_read_write_commit_releases_its_transaction(database: Any, control: Any) -> None:
    control.fail("Commit", "PERMISSION_DENIED", "refused")
    insert = "INSERT INTO SampleQueue (Id, Payload) VALUES (1, 'x')"
    with pytest.raises(gexc.PermissionDenied):
        database.run_in_transaction(lambda t: t.execute_update(insert))
    assert count(database) == 0
    database.run_in_transaction(lambda t: t.execute_update(insert))  # no lock left behind
    assert count(database) == 1


def test_after_applies_the_call_then_answers_the_fault(database: Any, control: Any) -> None:
    control.fail("Commit", "DEADLINE_EXCEEDED", "the answer was lost", after=True)
    with pytest.raises(gexc.DeadlineExceeded, match="the answer was lost"):
        with database.batch() as batch:
            batch.send(queue="SampleQueue", key=(1,), payload="x")
    assert count(database) == 1  # it had applied


def test_a_batch_dml_fault_matches_any_of_its_statements(database: Any, control: Any) -> None:
    control.fail("ExecuteBatchDml", "ABORTED", "Transaction was aborted", sql_contains="(2,")

    def work(t: Any) -> None:
        t.batch_update(
            [
                "INSERT INTO SampleQueue (Id, Payload) VALUES (1, 'a')",
                "INSERT INTO SampleQueue (Id, Payload) VALUES (2, 'b')",
            ]
        )

    database.run_in_transaction(work)  # ABORTED: the client runs the transaction again
    assert count(database) == 2
    batches = [r for r in control.requests() if r.method == "ExecuteBatchDml"]
    assert len(batches) == 2


def test_the_record_holds_each_call_parsed_in_arrival_order(database: Any, control: Any) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(5,), payload="hello")
    query(database, "SELECT 42")
    [commit] = control.commits()
    assert commit.mutations[0].send.queue == "SampleQueue"
    assert list(commit.mutations[0].send.key) == ["5"]
    [select] = control.sql("SELECT 42")
    assert select.method == "ExecuteStreamingSql"
    assert select.request.transaction.single_use.read_only.strong
    methods = [r.method for r in control.requests()]
    assert methods.index("Commit") < methods.index("ExecuteStreamingSql", methods.index("Commit"))
    control.clear()
    assert control.requests() == []


def test_end_streams_ends_an_open_receive_as_its_duration_would(
    database: Any, control: Any
) -> None:
    sql = "SELECT * FROM RECEIVE_SampleQueue(max_batch_size => 1, max_duration => '60s')"
    done: list[list[Any]] = []
    reader = threading.Thread(target=lambda: done.append(query(database, sql)), daemon=True)
    started = time.monotonic()
    reader.start()
    wait_until(lambda: control.sql("RECEIVE_SampleQueue"))
    control.end_streams()
    reader.join(20)
    assert done == [[]] and time.monotonic() - started < 30
    assert wait_until(control.receive_ends) == ["ended"]


def test_bad_faults_are_refused(control: Any) -> None:
    with pytest.raises(ValueError, match="gRPC status"):
        control.fail("Commit", "NOT_A_STATUS")
    with pytest.raises(ValueError, match="short name"):
        control.fail("/google.spanner.v1.Spanner/Commit", "ABORTED")
    raw = control._channel.unary_unary(SERVICE + "Fail")
    with pytest.raises(grpc.RpcError) as raised:
        raw(b'{"method": "Commit", "code": "OK"}', timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_script_answers_the_next_matching_query_instead_of_running_it(
    database: Any, control: Any
) -> None:
    control.script("SELECT 7", [["a", None], ["b", "c"]])
    assert query(database, "SELECT 7") == [["a", None], ["b", "c"]]  # STRING columns
    assert query(database, "SELECT 7") == [[7]]  # taken: the next one runs
    control.script("SELECT 8", error=("PERMISSION_DENIED", "scripted refusal"))
    with pytest.raises(gexc.PermissionDenied, match="scripted refusal"):
        query(database, "SELECT 8")


def test_a_scripted_receive_has_the_calls_columns_and_leases_nothing(
    database: Any, control: Any
) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="kept")
    sql = (
        "SELECT Id, SpannerLeaseToken FROM RECEIVE_SampleQueue(max_batch_size => 1, "
        "max_duration => '1ms')"
    )
    control.script("RECEIVE_SampleQueue", [["5", "t-scripted"]])
    assert query(database, sql) == [[5, "t-scripted"]]  # INT64 and STRING, as selected
    got = query(database, sql)  # the real message: it was not leased
    assert [row[0] for row in got] == [1] and got[0][1] != "t-scripted", got


def test_receive_batches_carry_no_resume_token_when_configured(database: Any, control: Any) -> None:
    from google.cloud.spanner_v1.types import ExecuteSqlRequest

    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="x")
    sql = "SELECT * FROM RECEIVE_SampleQueue(max_batch_size => 1, max_duration => '1ms')"
    session = database.session()
    session.create()
    try:

        def parts() -> list[Any]:
            request = ExecuteSqlRequest(session=session.name, sql=sql)
            return list(database.spanner_api.execute_streaming_sql(request=request))

        control.configure(resume_tokens=False)
        untokened = parts()
        assert any(p.values for p in untokened) and not any(p.resume_token for p in untokened)
        control.clear()  # settings back to the default: a token on every batch
        with database.batch() as batch:
            batch.send(queue="SampleQueue", key=(2,), payload="y")
        tokened = parts()
        assert all(p.resume_token for p in tokened if p.values)
    finally:
        session.delete()

"""Writes of the native engine at the wire (issue 20): fan-out past Spanner's 950-parameter
limit, renewals of any size, a batch ack in one statement, the missing-parent error in both
wordings, and commits whose answer is lost."""

from __future__ import annotations

import grpc
import pytest
from django.db import transaction

from spanner_queues import api
from spanner_queues.engines import engines
from spanner_queues.exceptions import (
    CommitOutcomeUnknown,
    InvalidMessage,
    MessageAlreadyAcked,
    MessageAlreadyExists,
)
from tests.conftest import wait_until
from tests.testapp.models import Account, Upload, UploadTasks, UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


def engine():
    return engines["default"]


def out(user_id: int, message_id: str):
    return api.build_message(
        UserTasks, {"user_id": user_id, "message_id": message_id, "payload": b"x"}
    )


# --- item 1: fan-out and renewals past 950 parameters -------------------------------------
def test_the_front_refuses_more_than_950_parameters_as_spanner_does(front) -> None:
    """The front is as strict as Spanner, or the tests below could not fail."""
    from django.db import connection

    from spanner_queues.drivers import causes

    sql = "SELECT ARRAY_LENGTH([" + ", ".join(["%s"] * 951) + "])"
    with pytest.raises(Exception) as raised:
        with connection.cursor() as cursor:
            cursor.execute(sql, list(range(951)))
    assert any("maximum allowed limit of 950" in str(e) for e in causes(raised.value))


def test_send_many_of_2000_is_chunked_under_950_parameters_in_one_transaction(front) -> None:
    with transaction.atomic():
        event = Account.objects.create(name="launch")
        api.send_many(
            UserTasks,
            [
                {"user_id": event.pk, "message_id": f"invitee-{i}", "payload": b"x"}
                for i in range(2000)
            ],
        )
    inserts = front.sql("INSERT INTO testapp_usertasks")
    assert len(inserts) == 7  # 316 messages x 3 parameters per statement
    assert all(len(dict(r.request.params)) <= 950 for r in inserts)
    assert [r.method for r in front.requests() if r.method in ("Commit", "Rollback")] == ["Commit"]
    assert UserTasks.objects.count() == 2000


def test_renewal_of_more_than_950_tokens_is_chunked(front) -> None:
    UserTasks.send_many([{"user_id": 1, "message_id": m, "payload": b""} for m in "ab"])
    held = wait_until(lambda: api.receive(UserTasks, max_messages=2))
    tokens = [m.lease_token for m in held] + [f"not-a-token-{i}" for i in range(1500)]
    front.clear()
    renewed = engine().renew_tokens(UserTasks, tokens)
    calls = front.sql("RENEWLEASE_")
    assert [len(dict(r.request.params)) for r in calls] == [950, 552]
    assert {old for old, (new, _) in renewed.items() if new} == {m.lease_token for m in held}


# --- item 10: a batch ack is one statement --------------------------------------------------
def test_batch_ack_is_one_delete_asserting_every_row(front) -> None:
    UserTasks.send_many([{"user_id": 1, "message_id": f"m{i}", "payload": b""} for i in range(20)])
    front.clear()
    with transaction.atomic():
        api.ack_many(UserTasks, [(1, f"m{i}") for i in range(20)])
    [delete] = front.sql("DELETE FROM testapp_usertasks")
    assert delete.sql.startswith("DELETE FROM testapp_usertasks WHERE (user_id, message_id) IN (")
    assert delete.sql.endswith("ASSERT_ROWS_MODIFIED 20")
    assert not UserTasks.objects.exists()


def test_batch_ack_with_one_missing_message_acks_nothing_and_rolls_back(front) -> None:
    UserTasks.send_many([{"user_id": 1, "message_id": f"m{i}", "payload": b""} for i in range(5)])
    with pytest.raises(MessageAlreadyAcked), transaction.atomic():
        Account.objects.create(name="work")
        api.ack_many(UserTasks, [(1, f"m{i}") for i in range(6)])  # m5 does not exist
    assert UserTasks.objects.count() == 5
    assert not Account.objects.exists()


def test_batch_ack_naming_a_key_twice_is_already_acked(front) -> None:
    UserTasks.send(user_id=1, message_id="a", payload=b"")
    with pytest.raises(MessageAlreadyAcked), transaction.atomic():
        api.ack_many(UserTasks, [(1, "a"), (1, "a")])
    assert UserTasks.objects.count() == 1


# --- item 6: a missing parent row, in Spanner's and in the emulator's words ----------------
@pytest.mark.parametrize(
    "text",
    [
        "Parent row for row [41,m] in table testapp_uploadtasks is missing. Row cannot be written.",
        "Insert failed because key was not found in parent table:  Parent Table: "
        "testapp_upload  Child Table: testapp_uploadtasks  Key: {Int64(41)}",
    ],
)
def test_missing_parent_row_is_invalid_message_in_either_wording(front, text) -> None:
    front.fail("ExecuteStreamingSql", grpc.StatusCode.NOT_FOUND, text, sql_contains="INSERT INTO")
    with pytest.raises(InvalidMessage, match="no parent row"):
        UploadTasks.send(upload_id=41, message_id="m", payload=b"")


def test_send_without_its_parent_row_is_invalid_message(front) -> None:
    """The front enforces the interleave (in Spanner's words)."""
    with pytest.raises(InvalidMessage, match="no parent row"):
        UploadTasks.send(upload_id=404, message_id="m", payload=b"")
    upload = Upload.objects.create(name="u")
    UploadTasks.send(upload_id=upload.pk, message_id="m", payload=b"")


# --- item 5: a commit whose answer is lost ---------------------------------------------------
def test_send_mutations_applied_then_unavailable_is_sent_once_not_already_exists(front) -> None:
    """The client retries Commit on UNAVAILABLE; a blind (single-use) commit applied twice
    answered ALREADY_EXISTS: "nothing was sent", while the message was there."""
    front.fail("Commit", grpc.StatusCode.UNAVAILABLE, "connection reset", after=True)
    engine().send_mutations(UserTasks, [out(1, "a")])
    assert UserTasks.objects.filter(user_id=1, message_id="a").count() == 1
    commits = front.commits()
    assert len(commits) == 2 and all(c.transaction_id for c in commits)  # retried, safely
    assert commits[0].transaction_id == commits[1].transaction_id


def test_ack_mutations_applied_then_unavailable_is_acked_not_nothing_acked(front) -> None:
    UserTasks.send(user_id=1, message_id="a", payload=b"")
    front.fail("Commit", grpc.StatusCode.UNAVAILABLE, "connection reset", after=True)
    engine().ack_mutations(UserTasks, [(1, "a")])
    assert not UserTasks.objects.exists()


@pytest.mark.parametrize("code", [grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL])
def test_a_lost_commit_answer_is_commit_outcome_unknown(front, code) -> None:
    front.fail("Commit", code, "the answer was lost", after=True)
    with pytest.raises(CommitOutcomeUnknown, match="may or may not have been applied"):
        engine().send_mutations(UserTasks, [out(1, "a")])
    assert UserTasks.objects.filter(user_id=1, message_id="a").count() == 1  # it had applied


def test_a_refused_commit_is_still_definite(front) -> None:
    UserTasks.send(user_id=1, message_id="a", payload=b"")
    with pytest.raises(MessageAlreadyExists, match="nothing was sent"):
        engine().send_mutations(UserTasks, [out(1, "a")])
    with pytest.raises(MessageAlreadyAcked, match="nothing was acked"):
        engine().ack_mutations(UserTasks, [(1, "a"), (1, "missing")])
    assert UserTasks.objects.count() == 1


# --- item 10: why a receiver's ack is DML, not an Ack mutation riding in its commit --------
def test_an_ack_mutation_buffered_in_the_dbapi_transaction_is_lost_when_it_replays(front) -> None:
    """The DB-API replays an aborted transaction's statements in a new transaction, not the
    mutations buffered on the old one: an ``Ack`` mutation in the receiver's commit would be
    dropped while the receiver's work commits, and the message would be done again. The ack is
    therefore a DELETE statement, which the replay runs (and asserts) again."""
    from django.db import connection

    UserTasks.send_many([{"user_id": 1, "message_id": m, "payload": b""} for m in "ab"])
    front.fail("Commit", grpc.StatusCode.ABORTED, "Transaction was aborted")
    with transaction.atomic():
        Account.objects.create(name="work a")
        connection.connection.transaction_checkout().ack(queue="testapp_usertasks", key=["1", "a"])
    assert Account.objects.count() == 1  # the work committed, on the replay...
    assert UserTasks.objects.filter(message_id="a").exists()  # ...without its ack
    front.fail("Commit", grpc.StatusCode.ABORTED, "Transaction was aborted")
    with transaction.atomic():
        Account.objects.create(name="work b")
        api.ack_many(UserTasks, [(1, "b")])
    assert Account.objects.count() == 2
    assert not UserTasks.objects.filter(message_id="b").exists()  # the DELETE was replayed


# --- delete_any (api.replace): one DELETE statement for all its keys ----------------------
def test_delete_any_is_one_statement_for_every_key_missing_ones_skipped(front) -> None:
    """Composite keys past one statement's 950 parameters: one DELETE per 475 keys, in the
    caller's transaction (rolled back with it); a key with no message is no error."""
    keys = [(7, f"d{i}") for i in range(1000)]
    with transaction.atomic():
        engine().send_many(UserTasks, [out(*k) for k in keys[:400]], using="default")
    table = UserTasks._meta.db_table
    front.clear()
    with pytest.raises(RuntimeError), transaction.atomic():
        engine().delete_any(UserTasks, keys, using="default")
        raise RuntimeError("roll back")
    assert UserTasks.objects.count() == 400
    front.clear()
    with transaction.atomic():
        engine().delete_any(UserTasks, keys, using="default")
    assert len(front.sql(f"DELETE FROM {table}")) == 3  # 475 + 475 + 50 keys
    assert not UserTasks.objects.exists()

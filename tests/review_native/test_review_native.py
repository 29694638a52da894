"""Review findings on the native engine that the existing tests/native suite cannot catch."""

from __future__ import annotations

import pytest

from spanner_queues import api
from tests.testapp.models import UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.xfail(strict=True, reason="docs inaccuracy (harmless extra round trip), not a bug")
def test_ack_out_of_range_statement_is_sent_once(fake) -> None:
    """docs/howto/spanner.md: 'The statement is not retried.' When the DELETE is the first
    statement of the transaction (inline begin), spanner_dbapi re-runs it after an explicit
    BeginTransaction (cursor.py _execute_in_rw_transaction, 'inline-begin failure')."""
    from spanner_queues.exceptions import MessageAlreadyAcked

    UserTasks.send(user_id=1, message_id="gone", payload="")
    [message] = api.receive(UserTasks)
    api.ack(message)
    fake.clear()
    with pytest.raises(MessageAlreadyAcked):
        api.ack(message)
    assert len(fake.sql("DELETE FROM testapp_usertasks")) == 1


@pytest.mark.xfail(
    strict=True,
    reason="conditional risk, [U] on real Spanner: google-cloud-spanner buffers "
    "PartialResultSets until one carries a resume_token (snapshot._restart_on_unavailable), "
    "so a RECEIVE stream without resume tokens surfaces rows only at max_duration",
)
def test_rows_without_resume_tokens_are_not_held_until_the_stream_ends(fake, monkeypatch) -> None:
    import time

    from tests.native import fake_spanner

    original = fake_spanner.SpannerServicer._receive

    def no_resume_tokens(self, request, context, match):
        for prs in original(self, request, context, match):
            prs.resume_token = b""
            yield prs

    monkeypatch.setattr(fake_spanner.SpannerServicer, "_receive", no_resume_tokens)
    UserTasks.send(user_id=1, message_id="a", payload="x")
    deadline = time.monotonic() + 3.0  # the stream's max_duration is 5 s
    got = []
    while not got and time.monotonic() < deadline:
        got = api.receive(UserTasks)
    assert got, "the leased row sat in the client's buffer until the stream ended"


@pytest.mark.xfail(strict=True, reason="test-quality evidence, not an engine bug")
def test_aborted_commit_wire_test_exercises_our_runner(fake) -> None:
    """tests/native/test_wire.py::test_aborted_commit_is_retried_by_the_transaction_runner
    claims to test spanner_queues' runner; spanner_dbapi's Connection.commit already replays
    the transaction on ABORTED (connection.py L556-558), so ``fn`` runs once and the runner's
    retry loop is never reached. Evidence that the existing test cannot fail on our code."""
    import grpc

    from spanner_queues.transactions import run_in_transaction

    calls = []

    def fn():
        calls.append(1)
        UserTasks.send(user_id=5, message_id="x", payload="")

    fake.fail("Commit", grpc.StatusCode.ABORTED, "Transaction was aborted")
    run_in_transaction(fn, using="default")
    assert len(calls) == 2, "the ABORTED commit was retried by spanner_dbapi, not by our runner"

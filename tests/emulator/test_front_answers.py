"""The open answers the front can be told to give (``spanner_queues_emulator.answers``), each
chosen with ``--backoff``/``--retry-info``, their environment variables, or
``FrontControl.configure``: when a message whose lease ended unacked is due again, and whether
an ABORTED carries a ``RetryInfo``."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from typing import Any

import grpc
import pytest

from spanner_queues_emulator.answers import (
    BACKOFF_ENV,
    BACKOFF_MODES,
    RETRY_INFO_MODES,
    backoff_mode,
    retry_info_mode,
)
from spanner_queues_emulator.schema import LEASE_EXPIRES, NEXT_DELIVERY
from spanner_queues_emulator.status import RETRY_INFO

RECEIVE = "SELECT Id FROM RECEIVE_SampleQueue(max_batch_size => 1, max_duration => '2s')"


def lease_one(database: Any) -> timedelta:
    """Send one message, lease it, and say how long after its lease ends it is due again
    (the hidden next-delivery time the claim wrote, read from the table behind)."""
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="x")
    with database.snapshot() as snap:
        assert [row[0] for row in snap.execute_sql(RECEIVE)] == [1]
    with database.snapshot() as snap:
        [(lease_end, due)] = list(
            snap.execute_sql(f"SELECT {LEASE_EXPIRES}, {NEXT_DELIVERY} FROM SampleQueue")
        )
    return due - lease_end


def test_the_exponential_back_off_starts_about_a_second_after_the_lease(
    database: Any, control: Any
) -> None:
    assert timedelta(seconds=0.8) <= lease_one(database) <= timedelta(seconds=1)


def test_no_back_off_makes_a_message_due_as_its_lease_ends(database: Any, control: Any) -> None:
    control.configure(backoff="none")
    assert lease_one(database) == timedelta(0)


def test_the_slow_back_off_waits_eight_to_ten_seconds_after_the_lease(
    database: Any, control: Any
) -> None:
    control.configure(backoff="slow")
    assert timedelta(seconds=8) <= lease_one(database) <= timedelta(seconds=10)


def aborted_trailers(database: Any, control: Any) -> list[str]:
    control.fail("Commit", "ABORTED", "Transaction was aborted")
    session = database.session()
    session.create()
    try:
        txn = session.transaction()
        txn.begin()
        txn.send(queue="SampleQueue", key=(7,), payload="y")
        with pytest.raises(Exception) as raised:
            txn.commit()
    finally:
        session.delete()
    error = raised.value
    assert getattr(error, "grpc_status_code", None) == grpc.StatusCode.ABORTED, error
    call = error.response  # the gRPC call: its trailing metadata
    trailing = call.trailing_metadata()
    assert trailing is not None
    return [k for k, _ in trailing]


def test_an_aborted_carries_a_retry_info_by_default(database: Any, control: Any) -> None:
    assert RETRY_INFO in aborted_trailers(database, control)


def test_an_aborted_carries_no_retry_info_when_told_never(database: Any, control: Any) -> None:
    control.configure(retry_info="never")
    assert RETRY_INFO not in aborted_trailers(database, control)


def test_clear_restores_the_fronts_own_answers(database: Any, control: Any) -> None:
    control.configure(backoff="none", retry_info="never")
    control.clear()
    assert timedelta(seconds=0.8) <= lease_one(database) <= timedelta(seconds=1)
    assert RETRY_INFO in aborted_trailers(database, control)


def test_modes_are_checked_and_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, control: Any
) -> None:
    assert backoff_mode() == BACKOFF_MODES[0] == "exponential"
    assert retry_info_mode() == RETRY_INFO_MODES[0] == "always"
    monkeypatch.setenv(BACKOFF_ENV, "slow")
    assert backoff_mode() == "slow"
    with pytest.raises(ValueError, match="backoff must be one of exponential, none, slow"):
        backoff_mode("fast")
    with pytest.raises(ValueError, match="retry_info must be one of always, never"):
        control.configure(retry_info="sometimes")


def test_the_command_line_refuses_an_unknown_mode() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "spanner_queues_emulator", "--backoff", "fast"],
        capture_output=True,
        text=True,
        env={**os.environ},
        timeout=60,
    )
    assert result.returncode == 2
    assert "invalid choice: 'fast'" in result.stderr

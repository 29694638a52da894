"""What a lease does to a message's ``DeliverTime``, which Google leaves open
(``../shared/spec/spanner-queues.md`` §7): the front plays each answer
(``queues.DELIVER_TIME_MODES``). ``kept`` (the default) keeps the sender's time through leases;
``lease_expiry`` moves it to the lease's expiry on each lease (a claim or a renewal);
``next_due`` to when the message is next due (the expiry plus the back-off). RECEIVE shows the
moved value, and so does every later read."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime
from typing import Any

import pytest

from spanner_queues_emulator.queues import DELIVER_TIME_ENV, deliver_time_mode

RECEIVE = (
    "SELECT Id, DeliverTime, SpannerLeaseExpirationTimestamp, SpannerLeaseToken "
    "FROM RECEIVE_SampleQueue(max_batch_size => 1, max_duration => '2s')"
)


def lease_one(database: Any) -> tuple[datetime, datetime, str]:
    """(DeliverTime, lease expiry, token) of the one message RECEIVE leases."""
    with database.snapshot() as snap:
        [(_, deliver, expires, token)] = list(snap.execute_sql(RECEIVE))
    return deliver, expires, token


def stored_deliver_time(database: Any) -> datetime:
    with database.snapshot() as snap:
        [(deliver,)] = list(snap.execute_sql("SELECT DeliverTime FROM SampleQueue WHERE Id = 1"))
    return deliver


def send_one(database: Any) -> datetime:
    """Send message 1; its DeliverTime as stored."""
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="x")
    return stored_deliver_time(database)


def renew(database: Any, token: str) -> datetime:
    sql = "SELECT * FROM RENEWLEASE_SampleQueue(lease_tokens => [@t])"
    with database.snapshot() as snap:
        [(_, _, expires)] = list(snap.execute_sql(sql, params={"t": token}))
    return expires


def test_kept_keeps_the_senders_deliver_time_through_leases(database: Any, control: Any) -> None:
    sent = send_one(database)
    deliver, expires, token = lease_one(database)
    assert deliver == sent < expires
    renew(database, token)
    assert stored_deliver_time(database) == sent


def test_lease_expiry_moves_deliver_time_to_the_leases_expiry_on_each_lease(
    database: Any, control: Any
) -> None:
    control.configure(deliver_time="lease_expiry")
    send_one(database)
    deliver, expires, token = lease_one(database)
    assert deliver == expires == stored_deliver_time(database)
    renewed = renew(database, token)
    assert stored_deliver_time(database) == renewed > expires


def test_next_due_moves_deliver_time_past_the_leases_expiry(database: Any, control: Any) -> None:
    control.configure(deliver_time="next_due")
    send_one(database)
    deliver, expires, _ = lease_one(database)
    assert deliver > expires  # (the expiry plus the back-off of the first attempt)
    assert stored_deliver_time(database) == deliver


def test_clear_restores_the_fronts_own_deliver_time_choice(database: Any, control: Any) -> None:
    control.configure(deliver_time="lease_expiry")
    control.clear()
    sent = send_one(database)
    deliver, _, _ = lease_one(database)
    assert deliver == sent


def test_the_deliver_time_choice_comes_from_the_argument_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spanner_queues_emulator.faults import Faults

    monkeypatch.delenv(DELIVER_TIME_ENV, raising=False)
    assert deliver_time_mode() == "kept"
    monkeypatch.setenv(DELIVER_TIME_ENV, "next_due")
    assert deliver_time_mode() == "next_due"
    assert deliver_time_mode("lease_expiry") == "lease_expiry"
    with pytest.raises(ValueError, match="kept, lease_expiry, next_due"):
        deliver_time_mode("moved")
    with pytest.raises(ValueError, match="deliver_time must be one of"):
        Faults().control("Configure", {"deliver_time": "moved"}, lambda: None)


def test_the_command_refuses_an_unknown_deliver_time_before_it_starts() -> None:
    command = [sys.executable, "-m", "spanner_queues_emulator", "--host-port", "127.0.0.1:0"]
    flag = subprocess.run([*command, "--deliver-time", "moved"], capture_output=True, timeout=60)
    assert flag.returncode == 2 and b"lease_expiry" in flag.stderr
    env = {**os.environ, DELIVER_TIME_ENV: "moved"}
    from_env = subprocess.run(command, capture_output=True, timeout=60, env=env)
    assert from_env.returncode == 2 and b"deliver_time must be one of" in from_env.stderr

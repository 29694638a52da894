"""How the front answers a very short ``RECEIVE`` (``max_duration`` under
``receiving.SHORT_RECEIVE_SECONDS``), a choice Google leaves open (it advises against very short
durations and documents no minimum): ``generous`` (the default) looks once whatever the
duration, ``empty`` answers nothing while messages are due, ``refuse`` fails it with
INVALID_ARGUMENT in words that do not say "duration". Longer calls always look."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from google.api_core import exceptions as gexc

from spanner_queues_emulator.receiving import SHORT_RECEIVE_ENV, short_receive_mode

SHORT = "SELECT Id FROM RECEIVE_SampleQueue(max_batch_size => 3, max_duration => '1ms')"
LONG = "SELECT Id FROM RECEIVE_SampleQueue(max_batch_size => 3, max_duration => '2s')"


def receive(database: Any, sql: str) -> list[int]:
    with database.snapshot() as snap:
        return sorted(row[0] for row in snap.execute_sql(sql))


def send_three(database: Any) -> None:
    with database.batch() as batch:
        for i in range(3):
            batch.send(queue="SampleQueue", key=(i,), payload=str(i))


def test_generous_looks_once_however_short_the_call(database: Any, control: Any) -> None:
    send_three(database)
    assert receive(database, SHORT) == [0, 1, 2]


def test_empty_answers_nothing_to_a_short_call_while_messages_are_due(
    database: Any, control: Any
) -> None:
    control.configure(short_receive="empty")
    send_three(database)
    assert receive(database, SHORT) == []
    assert receive(database, LONG) == [0, 1, 2]  # a longer call looks


def test_refuse_fails_a_short_call_without_saying_duration(database: Any, control: Any) -> None:
    control.configure(short_receive="refuse")
    send_three(database)
    with pytest.raises(gexc.InvalidArgument) as refused:
        receive(database, SHORT)
    assert "duration" not in str(refused.value).lower()
    assert receive(database, LONG) == [0, 1, 2]  # nothing was leased by the refused call


def test_clear_restores_the_fronts_own_choice(database: Any, control: Any) -> None:
    control.configure(short_receive="refuse")
    control.clear()
    send_three(database)
    assert receive(database, SHORT) == [0, 1, 2]


def test_the_choice_comes_from_the_argument_then_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SHORT_RECEIVE_ENV, raising=False)
    assert short_receive_mode() == "generous"
    monkeypatch.setenv(SHORT_RECEIVE_ENV, "empty")
    assert short_receive_mode() == "empty"
    assert short_receive_mode("refuse") == "refuse"
    with pytest.raises(ValueError, match="generous, empty, refuse"):
        short_receive_mode("strict")
    with pytest.raises(Exception, match="short_receive must be one of"):
        from spanner_queues_emulator.faults import Faults

        Faults().control("Configure", {"short_receive": "strict"}, lambda: None)


def test_the_command_refuses_an_unknown_choice_before_it_starts() -> None:
    command = [sys.executable, "-m", "spanner_queues_emulator", "--host-port", "127.0.0.1:0"]
    flag = subprocess.run([*command, "--short-receive", "strict"], capture_output=True, timeout=60)
    assert flag.returncode == 2 and b"generous" in flag.stderr
    env = {**os.environ, SHORT_RECEIVE_ENV: "strict"}
    from_env = subprocess.run(command, capture_output=True, timeout=60, env=env)
    assert from_env.returncode == 2 and b"short_receive must be one of" in from_env.stderr

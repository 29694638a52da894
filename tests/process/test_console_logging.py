"""``runqueueworker``'s log lines reach the console as ``runserver``'s do: in a project without
a ``LOGGING`` setting its lifecycle lines (started, stopped) and the pause and resume lines
appear at the default verbosity; in a project whose logging already writes them, they appear
once. Real child processes, on whichever database the suite runs."""

from __future__ import annotations

import signal
from collections.abc import Callable
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from tests.children import TIMEOUT, Child
from tests.conftest import wait_until

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def run_through_a_pause(child_env: dict[str, str], tmp_path: Path, logging: str, *args: str) -> str:
    """A worker on ``workerapp.WorkItems`` (settings' LOGGING: ``logging``) while the queue is
    paused and resumed; its whole output once it stopped."""
    env = {**child_env, "SQ_TEST_LOGGING": logging}
    worker = Child(env, tmp_path, "workerapp.WorkItems", *args)
    try:
        wait_until(lambda: "started" in worker.err.read_text(), timeout=TIMEOUT)
        call_command("pausequeue", "workerapp.WorkItems", stdout=StringIO())
        wait_until(lambda: "is paused" in worker.err.read_text(), timeout=TIMEOUT)
        call_command("resumequeue", "workerapp.WorkItems", stdout=StringIO())
        wait_until(lambda: "was resumed" in worker.err.read_text(), timeout=TIMEOUT)
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
        return worker.err.read_text()
    finally:
        worker.kill()


def count(text: str) -> Callable[[str], int]:
    return lambda needle: sum(needle in line for line in text.splitlines())


def test_without_logging_settings_lifecycle_and_pause_lines_reach_the_console(
    child_env: dict[str, str], tmp_path: Path
) -> None:
    err = run_through_a_pause(child_env, tmp_path, "none")
    lines = count(err)
    assert lines("started: queues=workerapp.WorkItems") == 1, err
    assert lines("workerapp.WorkItems is paused") == 1, err
    assert lines("workerapp.WorkItems was resumed") == 1, err
    assert lines("stopped") == 1, err


def test_a_project_logging_to_the_console_gets_each_line_once(
    child_env: dict[str, str], tmp_path: Path
) -> None:
    err = run_through_a_pause(child_env, tmp_path, "root")
    lines = count(err)
    assert lines("workerapp.WorkItems is paused") == 1, err
    assert lines("workerapp.WorkItems was resumed") == 1, err
    assert lines("started: queues=workerapp.WorkItems") == 1, err


def test_verbosity_0_keeps_the_console_quiet(child_env: dict[str, str], tmp_path: Path) -> None:
    env = {**child_env, "SQ_TEST_LOGGING": "none"}
    worker = Child(env, tmp_path, "workerapp.WorkItems", "--burst", "-v0")
    assert worker.wait() == 0, worker.output()
    assert worker.output() == ""

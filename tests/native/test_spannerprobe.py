"""``manage.py spannerprobe`` against the front in each of the answers it can play: the probe
names the answer the front gave for each question, says whether the engine's rule holds for
it, writes the JSON report, refuses a queue that holds data, and drops its scratch queues."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from tests.native.conftest import database_ddl

pytestmark = pytest.mark.django_db(transaction=True)


def probe(tmp_path: Path, *checks: str, queue: str = "probe_q") -> dict:
    report = tmp_path / "report.json"
    args = ["spannerprobe", "--queue", queue, "--report", str(report)]
    for check in checks:
        args += ["--check", check]
    call_command(*args)
    assert not any(queue in s for s in database_ddl())  # its scratch queues are dropped
    data = json.loads(report.read_text())
    return {f["check"]: f for f in data["findings"]}


def test_the_probe_names_every_answer_of_the_front_as_it_starts(front, tmp_path: Path) -> None:
    found = probe(tmp_path)
    assert list(found) == [
        "parse_json",
        "short_receive",
        "deliver_time",
        "backoff",
        "cancelled_stream",
        "retry_info",
        "sessions",
        "postgresql_names",
        "calls_per_message",
    ]
    assert not [f for f in found.values() if f["answer"] == "error"], found
    print(json.dumps(found, indent=1))

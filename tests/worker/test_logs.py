"""Structured logs: every record the worker writes about a message carries ``action``,
``queue``, ``message_key``, ``attempt``, ``worker_id`` and ``duration``, and the ``LOGGING`` of
docs/howto/logging.md turns them into JSON lines (python-json-logger)."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from spanner_queues.message import Message
from spanner_queues.worker import WorkerEvents
from spanner_queues.worker.events import LOG_FIELDS
from tests.conftest import wait_until
from tests.worker.conftest import running
from tests.workerapp.models import Jobs, WorkItems

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
#: actions whose records follow a receiver's run, so carry its duration
RAN = {"acked", "failed", "retried", "timed_out", "dead_lettered"}


def _about_a_message(record: logging.LogRecord) -> Message | None:
    if isinstance(record.args, dict):  # (the report table's records: named fields)
        found = record.args.get("message")
        return found if isinstance(found, Message) else None
    args = record.args if isinstance(record.args, tuple) else ()
    return next((a for a in args if isinstance(a, Message)), None)


def test_every_worker_record_about_a_message_carries_the_structured_fields(
    make_worker, events: WorkerEvents, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    WorkItems.send(id="ok", payload={})
    WorkItems.send(id="bad", payload={"fail": True})  # 3 attempts, then dead-lettered
    WorkItems.send(id="again", payload={"retry_after": 0, "trace": str(tmp_path / "t")})
    WorkItems.send(id="slow", payload={"mode": "limited", "spin_below": 2})  # 0.5 s limit
    WorkItems.send(id="backoff", payload={"retry_after": None, "trace": str(tmp_path / "b")})
    Jobs.send(kind="refund", id="r1")  # no receiver matches
    caplog.set_level(logging.DEBUG, logger="spanner_queues")
    # (each message alone: in a group the time limit's interrupt of "slow" runs the others of
    # its group again, and "again", whose trace then shows a run, no longer retries)
    worker = make_worker(WorkItems, Jobs, concurrency=2, group_size=1)
    with running(worker):
        wait_until(
            lambda: (
                events.counts["dead_lettered"]
                and events.counts["timed_out"]
                and events.counts["unmatched"]
                and events.counts["acked"] >= 3
            ),
            timeout=120,
        )
    records = [
        (r, m)
        for r in caplog.records
        if r.name.startswith("spanner_queues.worker")
        if (m := _about_a_message(r)) is not None
    ]
    for record, message in records:
        missing = [f for f in LOG_FIELDS if not hasattr(record, f)]
        assert not missing, (record.getMessage(), missing)
        assert record.worker_id == worker.worker_id, record.getMessage()
        assert (record.queue, record.message_key) == (message.queue, message.key)
        assert record.attempt == message.attempt
        if record.action in RAN:
            assert isinstance(record.duration, float) and record.duration >= 0
    retried = [r.getMessage() for r, m in records if r.action == "retried"]
    assert any(m.key == ("backoff",) for r, m in records if r.action == "retried")
    assert not [t for t in retried if "after None" in t], retried  # "after the back-off"
    by_action = {r.action: r for r, _ in records}
    assert set(by_action) >= RAN | {"unmatched"}, sorted(by_action)
    assert by_action["dead_lettered"].message_key == ("bad",)
    assert by_action["dead_lettered"].attempt == 3
    assert by_action["timed_out"].message_key == ("slow",)
    assert by_action["timed_out"].duration >= 0.5  # interrupted only past its limit
    assert by_action["unmatched"].duration is None  # no receiver ran
    assert by_action["unmatched"].miss == "kind='refund'"


def _logging_snippet() -> dict:
    """The ``LOGGING = {...}`` block of docs/howto/logging.md."""
    text = (ROOT / "docs/howto/logging.md").read_text()
    [block] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "LOGGING" in b]
    scope: dict = {}
    exec(block, scope)
    return scope["LOGGING"]


@pytest.fixture
def documented_logging() -> Iterator[io.StringIO]:
    """The documented LOGGING, its JSON handler writing to a buffer; Django's after."""
    pytest.importorskip("pythonjsonlogger")
    logging.config.dictConfig(_logging_snippet())
    out = io.StringIO()
    [handler] = logging.getLogger("spanner_queues").handlers
    handler.setStream(out)  # type: ignore[attr-defined]
    try:
        yield out
    finally:
        logging.config.dictConfig(settings.LOGGING)


def test_the_documented_logging_writes_worker_lines_as_json(
    make_worker, documented_logging: io.StringIO, tmp_path: Path
) -> None:
    WorkItems.send(id="again", payload={"retry_after": 0, "trace": str(tmp_path / "t")})
    worker = make_worker(WorkItems, burst=True)
    worker.run()
    lines = [json.loads(line) for line in documented_logging.getvalue().splitlines()]
    [retried] = [line for line in lines if line.get("action") == "retried"]
    assert retried["level"] == "INFO" and retried["logger"] == "spanner_queues.worker"
    assert retried["message"].startswith("workerapp.WorkItems(id='again') attempt 1: retry")
    assert retried["queue"] == "workerapp.WorkItems"
    assert retried["message_key"] == ["again"]
    assert retried["attempt"] == 1
    assert retried["worker_id"] == worker.worker_id
    assert isinstance(retried["duration"], float)
    assert "time" in retried
    # the start and stop lines are JSON too
    assert {"started", "stopped"} <= {line.get("action") for line in lines}

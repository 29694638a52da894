"""Worker regressions from review: graceful stops with prefetch spend no attempt; Retry(after=0)
is due at once; a key clash in the dead-letter queue leaves the message in its queue, logged."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from spanner_queues.worker import Worker
from tests.worker.conftest import require
from tests.workerapp.models import WorkItems, WorkItemsDead, WorkLog

pytestmark = pytest.mark.django_db(transaction=True)


def test_graceful_stops_with_prefetch_do_not_dead_letter_a_message_that_never_ran(
    make_worker: Callable[..., Worker],
) -> None:
    """Worker(prefetch>1): at stop(), prefetched-but-unstarted messages are released. The claim
    already counted a delivery (attempts + 1) and release keeps it, so each graceful stop
    (a deploy, an autoscaler) burns one attempt of every prefetched message. After
    max_attempts stops, _over_limit() sends the message to the dead-letter queue without its
    receiver ever having run or failed. Here: WorkItems.max_attempts = 3, three stops, then a
    normal worker dead-letters the message instead of running it."""
    require("supports_release")
    sent = WorkItems.send(id="never-failed", payload={})
    for _ in range(3):
        worker = make_worker(WorkItems, concurrency=1, prefetch=2)
        # What run() does: one claim puts the message in the buffer; stop() comes before an
        # executor starts it; the executor then returns it (_return_unstarted).
        assert worker._receive(worker.plans[0], 2) == 1
        worker.stop()
        worker._units.put(None)
        executor = threading.Thread(target=worker._executor)
        executor.start()
        executor.join(30)
        assert worker.stats.returned == 1
    make_worker(WorkItems, burst=True).run()
    assert not WorkItemsDead.objects.filter(pk=sent.key[0]).exists(), (
        "a message that never ran (and never failed) was dead-lettered"
    )
    assert WorkLog.objects.filter(key=sent.key[0]).exists()


def test_retry_after_zero_is_due_at_once(
    make_worker: Callable[..., Worker], tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    WorkItems.send(id="again", payload={"trace": str(trace), "retry_after": 0})
    make_worker(WorkItems, burst=True).run()
    # Re-sent due now (not after the back-off), so the same burst runs it a second time.
    assert [json.loads(line)["key"] for line in trace.read_text().splitlines()] == [
        ["again"],
        ["again"],
    ]
    assert WorkLog.objects.filter(key="again").count() == 1


def test_dead_letter_key_clash_leaves_the_message_and_says_why(
    make_worker: Callable[..., Worker], caplog: pytest.LogCaptureFixture
) -> None:
    require("supports_attempt_count")
    WorkItemsDead.send(id="clash", payload={"earlier": True})
    WorkItems.objects.create(id="clash", payload=b"{}", attempts=3)  # past max_attempts = 3
    with caplog.at_level(logging.ERROR, logger="spanner_queues"):
        make_worker(WorkItems, burst=True).run()
    assert "already holds key" in caplog.text
    assert WorkItems.objects.filter(pk="clash").exists()  # not lost...
    assert WorkItemsDead.objects.get(pk="clash").as_message().json() == {
        "earlier": True
    }  # ...nor overwriting

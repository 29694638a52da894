"""How a delivery ends when its receiver does not finish: a graceful stop (with prefetch) before
it ran spends no attempt; ``SystemExit`` stops the worker and leaves the message leased;
``Retry(after=0)`` is due at once; a key clash in the dead-letter queue leaves the message in
its queue, logged."""

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
    max_attempts stops, the exhausted check sends the message to the dead-letter queue without its
    receiver ever having run or failed. Here: WorkItems.max_attempts = 3, three stops, then a
    normal worker dead-letters the message instead of running it."""
    require("supports_release")
    sent = WorkItems.send(id="never-failed", payload={})
    for _ in range(3):
        worker = make_worker(WorkItems, concurrency=1, prefetch=2)
        # What run() does: one claim puts the message in the buffer; stop() comes before an
        # executor starts it; the executor then returns it (Outcomes.return_unstarted).
        assert worker.intake.fill(worker.plans[0], 2) == 1
        worker.stop()
        worker.units.put(None)
        executor = threading.Thread(target=worker._execute_units)
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
    # ...nor delivered again and again (it was released with back-off on every delivery,
    # forever): parked until an operator resolves the clash.
    from spanner_queues.worker import PARKED_UNTIL

    assert WorkItems.objects.get(pk="clash").deliver_time == PARKED_UNTIL
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="spanner_queues"):
        assert make_worker(WorkItems, burst=True).run().received == 0
    assert "already holds key" not in caplog.text


@pytest.mark.requires("stores_bookkeeping_fields")  # reads the attempts column
def test_a_receiver_raising_systemexit_stops_the_worker_and_leaves_the_message_leased(
    make_worker: Callable[..., Worker], caplog: pytest.LogCaptureFixture
) -> None:
    """A receiver raising SystemExit (a BaseException) used to kill its executor thread
    silently: a burst ended with processed=0 failed=0 and exit 0. Now the worker stops and
    run() raises WorkerCrashed; the message is neither acked nor released."""
    from spanner_queues.exceptions import WorkerCrashed

    WorkItems.send(id="bye", payload={"exit": 3})
    WorkItems.send(id="other", payload={})
    worker = make_worker(WorkItems, burst=True, concurrency=1, batch_size=1)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            raised.append(exc)

    with caplog.at_level(logging.CRITICAL, logger="spanner_queues"):
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(60)
    assert not thread.is_alive(), "the worker hung (its only executor thread had died)"
    assert len(raised) == 1 and isinstance(raised[0], WorkerCrashed), raised
    assert isinstance(raised[0].__cause__, SystemExit)
    assert "SystemExit" in caplog.text and "bye" in caplog.text
    row = WorkItems.objects.get(pk="bye")
    assert row.attempts == 1 and row.lease_token  # leased: delivered again after its lease
    assert not WorkLog.objects.filter(key="bye").exists()

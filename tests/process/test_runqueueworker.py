"""``manage.py runqueueworker`` as real child processes, on whichever database the suite runs
(SQLite or the Spanner emulator): burst, SIGTERM, a second signal, SIGKILL, two workers on one
queue, lease renewal, Retry(after=), the dead-letter queue, configuration errors.

Children use the test's database through ``child_env``; tests wait on files the receivers write
or on database state, never on fixed sleeps.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from spanner_queues import api
from spanner_queues.engines import engines
from tests.children import TIMEOUT, Start
from tests.conftest import wait_until
from tests.workerapp.models import Tasks, WorkItems, WorkItemsDead, WorkLog

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]
# The emulator runs one read-write transaction at a time (every claim and ack): fewer there.
MANY = int(
    os.environ.get("SQ_PROCESS_MESSAGES", 150 if os.environ.get("SPANNER_EMULATOR_HOST") else 500)
)

#: messages of the SIGKILL storm.
STORM = int(
    os.environ.get("SQ_STORM_MESSAGES", 60 if os.environ.get("SPANNER_EMULATOR_HOST") else 200)
)


def _started(path: Path) -> bool:
    """A receiver's start line is in ``path``: the file exists as soon as the receiver opens it,
    before the line is written (a SIGKILL then left an empty trace)."""
    return path.exists() and path.read_text().endswith("\n")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_burst_drains_then_exits_0(children: Start) -> None:
    sent = WorkItems.send_many([{"payload": {}} for _ in range(30)])
    Tasks.send(kind="email", id="e1")
    child = children("workerapp.WorkItems", "workerapp.Tasks", "--burst", "--concurrency", "2")
    assert child.wait() == 0, child.output()
    keys = sorted(WorkLog.objects.values_list("key", flat=True))
    assert keys == sorted([m.key[0] for m in sent] + ["e1"])
    assert not WorkItems.objects.exists() and not Tasks.objects.exists()
    assert "processed=31" in child.output()  # the -v1 summary line


def test_sigterm_finishes_in_flight_work_and_exits_0(children: Start, tmp_path: Path) -> None:
    go, trace = tmp_path / "go", tmp_path / "trace"
    # "a" sends "b" once unblocked, in its own transaction: "b" is due once the worker is
    # stopping. (Sent beside "a" it could be received first: queues have no order, and a child
    # can take longer to start than any delay allows. Sent by the test while "a" runs, it would
    # wait for SQLite's write lock, which the atomic receiver holds.)
    WorkItems.send(id="a", payload={"block": str(go), "trace": str(trace), "then_send": "b"})
    child = children("workerapp.WorkItems", "--concurrency", "1", "-v2")
    wait_until(lambda: _started(trace), timeout=TIMEOUT)  # "a" is in flight
    child.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "stopping" in child.output(), timeout=TIMEOUT)
    go.touch()
    assert child.wait() == 0, child.output()
    assert list(WorkLog.objects.values_list("key", flat=True)) == ["a"]  # finished and acked
    assert list(WorkItems.objects.values_list("id", flat=True)) == ["b"]  # never received


def test_second_signal_exits_at_once_non_zero(children: Start, tmp_path: Path) -> None:
    go, trace = tmp_path / "go", tmp_path / "trace"
    WorkItems.send(id="a", payload={"block": str(go), "trace": str(trace)})
    child = children("workerapp.WorkItems", "-v1")
    wait_until(lambda: _started(trace), timeout=TIMEOUT)
    child.proc.send_signal(signal.SIGINT)
    wait_until(lambda: "stopping" in child.output(), timeout=TIMEOUT)
    child.proc.send_signal(signal.SIGTERM)
    assert child.wait() != 0
    assert not WorkLog.objects.exists()
    assert WorkItems.objects.count() == 1  # unacked: delivered again after its lease


def test_sigkill_during_a_receiver_redelivers_after_the_lease(
    children: Start, tmp_path: Path
) -> None:
    go, trace = tmp_path / "go", tmp_path / "trace"
    sent = WorkItems.send(payload={"block": str(go), "trace": str(trace)})
    first = children("workerapp.WorkItems", "--lease", "1", name="first")
    wait_until(lambda: _started(trace), timeout=TIMEOUT)
    first.proc.kill()
    first.wait()
    go.touch()
    second = children("workerapp.WorkItems", "--max-messages", "1", name="second")
    assert second.wait() == 0, second.output()
    # Processed once more. Where deliveries are not counted (native: only failed runs are
    # recorded), a killed run leaves no count.
    again = 2 if engines["default"].features.supports_attempt_count else 1
    assert [line["attempt"] for line in _lines(trace)] == [1, again]
    assert list(WorkLog.objects.values_list("key", "attempt")) == [(sent.key[0], again)]
    assert not WorkItems.objects.exists()  # nothing lost, nothing left


def test_two_workers_share_a_queue_without_doing_anything_twice(
    children: Start, tmp_path: Path
) -> None:
    """Two workers drain one queue; then SIGTERM stops both."""
    trace = tmp_path / "trace"
    sent = WorkItems.send_many([{"payload": {"trace": str(trace)}} for _ in range(MANY)])
    workers = [
        children("workerapp.WorkItems", "--concurrency", "2", name=f"w{i}") for i in range(2)
    ]
    wait_until(lambda: not WorkItems.objects.exists(), timeout=TIMEOUT, interval=0.2)
    for child in workers:
        child.proc.send_signal(signal.SIGTERM)
        assert child.wait() == 0, child.output()
    committed = Counter(WorkLog.objects.values_list("key", flat=True))
    assert sorted(committed) == sorted(m.key[0] for m in sent)
    assert set(committed.values()) == {1}  # every message's work committed exactly once
    runs: dict[str, list[int]] = {}
    for line in _lines(trace):
        runs.setdefault(line["key"][0], []).append(line["attempt"])
    again = {key: attempts for key, attempts in runs.items() if len(attempts) > 1}
    # Every delivery up to the last ran; an attempt may show twice when its transaction was
    # retried from the start (TRANSACTION_RETRIES re-runs an atomic receiver after an abort).
    assert all(set(a) == set(range(1, max(a) + 1)) for a in again.values()), again
    assert not WorkItems.objects.exists()


def test_two_burst_workers_started_together_both_exit_0_and_leave_the_queue_empty(
    children: Start, tmp_path: Path
) -> None:
    """Two ``--burst`` workers started together on one backlog both exit 0, and nothing is
    left in the queue: neither exits while a row is leased to it and unread (on a streaming
    engine, a batch its RECEIVE call leased and still had on the wire)."""
    trace = tmp_path / "trace"
    sent = WorkItems.send_many([{"payload": {"trace": str(trace)}} for _ in range(MANY)])
    workers = [
        children("workerapp.WorkItems", "--burst", "--concurrency", "2", name=f"b{i}")
        for i in range(2)
    ]
    for child in workers:
        assert child.wait() == 0, child.output()
    assert not WorkItems.objects.exists()  # nothing leased behind: both have exited
    committed = Counter(WorkLog.objects.values_list("key", flat=True))
    assert sorted(committed) == sorted(m.key[0] for m in sent)
    assert set(committed.values()) == {1}


def test_sigkill_storm_loses_nothing_and_commits_no_effect_twice(
    children: Start, tmp_path: Path
) -> None:
    """Two workers of four threads each, SIGKILLed in turn while they work and started again:
    every message's effect (a WorkLog row written in its ack transaction) commits exactly
    once, and none is lost (messages leased by a killed worker come back after their lease)."""
    count = STORM
    sent = WorkItems.send_many([{"payload": {"pause": 0.05}} for _ in range(count)])
    args = ("workerapp.WorkItems", "--concurrency", "4")
    workers = [children(*args, name=f"storm{i}-0") for i in range(2)]
    kills = 0
    for round_ in range(1, 5):
        before = WorkLog.objects.count()
        if before >= count:
            break
        wait_until(
            lambda before=before: WorkLog.objects.count() >= min(before + 4, count),
            timeout=TIMEOUT,
        )
        victim = round_ % 2
        workers[victim].kill()  # SIGKILL, mid-message most likely
        kills += 1
        workers[victim] = children(*args, name=f"storm{victim}-{round_}")
    try:
        wait_until(lambda: not WorkItems.objects.exists(), timeout=TIMEOUT, interval=0.2)
    except BaseException:
        left = list(
            WorkItems.objects.values_list("id", "deliver_time", "attempts", "lease_expires_at")
        )
        logs = "\n".join(f"--- {c.out.name}\n{c.output()[-3000:]}" for c in workers)
        try:
            got = api.receive(WorkItems, max_messages=5)
        except Exception as exc:
            got = exc
        raise AssertionError(
            f"left: {left}\nnow: {timezone.now()}\nreceive: {got!r}\n{logs}"
        ) from None
    for child in workers:
        child.proc.send_signal(signal.SIGTERM)
        assert child.wait() == 0, child.output()
    committed = Counter(WorkLog.objects.values_list("key", flat=True))
    assert sorted(committed) == sorted(m.key[0] for m in sent)  # nothing lost
    assert set(committed.values()) == {1}  # no effect committed twice
    assert kills >= 2


def test_a_receiver_past_its_lease_keeps_it_by_renewal(children: Start, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    WorkItems.send(payload={"outlive_lease": 1.5, "mode": "external", "trace": str(trace)})
    child = children("workerapp.WorkItems", "--lease", "1", "--max-messages", "1")
    wait_until(lambda: _started(trace), timeout=TIMEOUT)  # the child's receiver is running
    seen: list = []

    def done() -> bool:
        seen.extend(api.receive(WorkItems))  # would get it if the lease had lapsed
        return WorkLog.objects.exists() or child.proc.poll() is not None

    wait_until(done, timeout=TIMEOUT, interval=0.1)
    assert child.wait() == 0, child.output()
    assert seen == []
    assert list(WorkLog.objects.values_list("attempt", flat=True)) == [1]
    assert not WorkItems.objects.exists()


def test_retry_after_is_not_delivered_before_its_time(children: Start, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    WorkItems.send(payload={"retry_after": 1.0, "trace": str(trace)})
    child = children("workerapp.WorkItems", "--max-messages", "2", "-v2")
    assert child.wait() == 0, child.output()
    first, second = _lines(trace)
    retried_at = datetime.fromisoformat(first["at"])
    assert datetime.fromisoformat(second["deliver_time"]) >= retried_at + timedelta(seconds=1)
    assert datetime.fromisoformat(second["at"]) >= datetime.fromisoformat(second["deliver_time"])
    assert "retried" in child.output()
    assert WorkLog.objects.count() == 1


def test_attempt_limit_moves_the_message_to_the_dead_letter_queue(children: Start) -> None:
    sent = WorkItems.send(payload={"fail": True})
    child = children("workerapp.WorkItems", "--max-messages", "3")
    assert child.wait() == 0, child.output()
    assert not WorkItems.objects.exists()
    assert WorkItemsDead.objects.get(pk=sent.key[0]).as_message().json() == {"fail": True}
    log = child.output()
    assert f"workerapp.WorkItems(id='{sent.key[0]}') attempt 1 failed" in log
    assert "dead-letter queue workerapp.WorkItemsDead" in log


@pytest.mark.engine_independent  # refused by the command before any engine is used
def test_configuration_errors_exit_non_zero_before_receiving(children: Start) -> None:
    WorkItems.send(payload={})
    unknown = children("workerapp.Nope", "--burst", name="unknown")
    no_receiver = children("testapp.Jobs", "--burst", name="noreceiver")
    bad_option = children("--concurrency", "0", name="badoption")
    assert unknown.wait() == 1 and "No queue named 'workerapp.Nope'" in unknown.output()
    assert no_receiver.wait() == 1 and "has no receiver" in no_receiver.output()
    assert bad_option.wait() == 2 and "must be at least 1" in bad_option.output()
    assert WorkItems.objects.count() == 1 and not WorkLog.objects.exists()


def test_a_receiver_raising_systemexit_exits_non_zero_and_keeps_the_message(
    children: Start,
) -> None:
    WorkItems.send(id="bye", payload={"exit": 0})
    child = children("workerapp.WorkItems", "--burst")
    assert child.wait() == 1, child.output()
    assert "SystemExit" in child.output() and "stopping the worker" in child.output()
    assert WorkItems.objects.filter(pk="bye").exists() and not WorkLog.objects.exists()

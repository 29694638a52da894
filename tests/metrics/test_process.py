"""A real ``runqueueworker --metrics-port 0`` scraped after known traffic, on whichever database
the suite runs (SQLite, the Spanner emulator with either engine)."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from spanner_queues import api
from spanner_queues.engines import engine_for
from spanner_queues.monitoring import QueueDepthSample
from spanner_queues.transactions import run_in_transaction
from tests.children import ROOT, TIMEOUT, Child
from tests.conftest import wait_until
from tests.workerapp.models import WorkItems, WorkItemsDead, WorkLog

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]
LINE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


class Worker(Child):
    """A ``runqueueworker`` child serving metrics on a port it picks and prints."""

    def __init__(self, env: dict[str, str], tmp: Path, *args: str, name: str = "w") -> None:
        super().__init__(env, tmp, *args, name=name)
        wait_until(lambda: "metrics on " in self.output() or self.proc.poll() is not None, TIMEOUT)
        found = re.search(r"metrics on (http://\S+)", self.output())
        assert found, self.output()
        self.url = found.group(1)

    def scrape(self) -> dict[tuple[str, frozenset], float]:
        with urllib.request.urlopen(self.url, timeout=30) as response:
            text = response.read().decode()
        values = {}
        for line in text.splitlines():
            match = LINE.match(line)
            if match:
                labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
                values[(match["name"], labels)] = float(match["value"])
        return values

    def value(self, name: str, **labels: str) -> float:
        return self.scrape().get((name, frozenset(labels.items())), 0.0)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def workers(child_env: dict[str, str], tmp_path: Path) -> Iterator:
    started: list[Worker] = []

    def start(*args: str, name: str = "w") -> Worker:
        worker = Worker(child_env, tmp_path, *args, name=name)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def test_a_scrape_after_known_traffic_shows_the_counts(workers, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    WorkItems.send_many([{"id": f"ok{i}", "payload": {}} for i in range(3)])
    WorkItems.send(id="retry", payload={"retry_after": 0.2, "trace": str(trace)})
    WorkItems.send(id="bad", payload={"fail": True})
    w = workers("workerapp.WorkItems", "--metrics-port", "0", "--metrics-interval", "1", "-v0")
    queue, dead = "workerapp.WorkItems", "workerapp.WorkItemsDead"
    wait_until(lambda: WorkItemsDead.objects.exists() and WorkLog.objects.count() == 4, TIMEOUT)
    wait_until(
        lambda: (
            w.value("spanner_queues_buffered_ready_messages", queue=dead) == 1
            and w.value("spanner_queues_queue_messages", queue=queue, state="total") == 0
        ),
        TIMEOUT,
    )
    # the worker reports an outcome just after its transaction commits: wait for the last ones
    outcome = "spanner_queues_worker_messages_total"
    wait_until(
        lambda: (
            w.value(outcome, queue=queue, outcome="acked") >= 4
            and w.value(outcome, queue=queue, outcome="dead_lettered") >= 1
        ),
        TIMEOUT,
    )
    m = w.scrape()

    def get(name: str, **labels: str) -> float:
        return m.get((name, frozenset(labels.items())), 0.0)

    assert get(outcome, queue=queue, outcome="acked") == 4  # 3, and "retry" at its 2nd run
    assert get(outcome, queue=queue, outcome="retried") == 1
    assert get(outcome, queue=queue, outcome="failed") == 3  # max_attempts = 3
    assert get(outcome, queue=queue, outcome="dead_lettered") == 1
    assert get(outcome, queue=queue, outcome="discarded") == 0
    assert get("spanner_queues_worker_messages_received_total", queue=queue) == 3 + 2 + 3
    # acks: 4 finished + the retry's ack-and-send + the dead letter's ack-and-send
    assert get("spanner_queues_message_ack_count_total", queue=queue) == 6
    # sends are counted by the process that sends: the test process sent the 5 messages; the
    # worker re-sent "retry" and sent "bad" to the dead-letter queue
    assert get("spanner_queues_message_send_count_total", queue=queue) == 1
    assert get("spanner_queues_message_send_count_total", queue=dead) == 1
    assert get("spanner_queues_worker_in_flight_messages", queue=queue) == 0
    runs = sum(
        v
        for (name, labels), v in m.items()
        if name == "spanner_queues_worker_receiver_duration_seconds_count"
        and ("queue", queue) in labels
    )
    assert runs == 4 + 1 + 3
    assert get("spanner_queues_oldest_unacked_message_age_seconds", queue=dead) >= 0
    assert get("spanner_queues_queue_messages", queue=dead, state="total") == 1
    # the depth history is sampled by the worker
    wait_until(lambda: QueueDepthSample.objects.filter(queue=dead, total=1).exists(), TIMEOUT)


def test_two_workers_on_one_host_each_serve_their_own_port(workers) -> None:
    first = workers("workerapp.WorkItems", "--metrics-port", "0", "-v0", name="a")
    second = workers("workerapp.WorkItems", "--metrics-port", "0", "-v0", name="b")
    assert first.url != second.url
    WorkItems.send_many([{"payload": {}} for _ in range(4)])
    acked = "spanner_queues_worker_messages_total"
    queue = "workerapp.WorkItems"
    wait_until(
        lambda: (
            first.value(acked, queue=queue, outcome="acked")
            + second.value(acked, queue=queue, outcome="acked")
            == 4
        ),
        TIMEOUT,
    )


def test_a_port_in_use_is_a_clear_error(workers, child_env, tmp_path: Path) -> None:
    first = workers("workerapp.WorkItems", "--metrics-port", "0", "-v0")
    port = first.url.rsplit(":", 1)[1].split("/")[0]
    result = subprocess.run(
        [sys.executable, "-m", "django", "runqueueworker", "--metrics-port", port],
        env=child_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 1
    assert "its own --metrics-port" in result.stderr


@pytest.mark.requires("stores_bookkeeping_fields", "supports_custom_lease")
def test_a_lease_that_ran_out_is_counted_when_the_worker_claims_it_again(workers) -> None:
    # (in a transaction that is run again when it loses a race: the emulator, one transaction
    # at a time, aborted this first write in 2 of 3 CI runs while a transaction of the file's
    # previous worker-process test was still active on it)
    db = engine_for(WorkItems).database
    run_in_transaction(lambda: WorkItems.send(id="lapsed", payload={}), using=db)
    [held] = api.receive(WorkItems, lease=timedelta(milliseconds=200))
    w = workers("workerapp.WorkItems", "--metrics-port", "0", "-v0")
    wait_until(lambda: WorkLog.objects.filter(key="lapsed").exists(), TIMEOUT)
    name = "spanner_queues_lease_expiration_count_total"
    assert w.value(name, queue="workerapp.WorkItems") == 1
    assert held.attempt == 1

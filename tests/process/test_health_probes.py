"""The probes of a real ``runqueueworker`` child, scraped over HTTP: ``/livez`` and ``/readyz``
answer 200 while it works, ``/readyz`` 503 while it stops (``/livez`` stays 200: draining is
alive), ``/livez`` 503 while a receiver is past its limit; on ``--health-port`` without metrics
and on the metrics port."""

from __future__ import annotations

import re
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from spanner_queues import api
from tests.children import TIMEOUT, Child, Start
from tests.conftest import wait_until
from tests.workerapp.models import WorkItems, WorkLog

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


class Probed(Child):
    """A ``runqueueworker`` child serving its probes on a port it picks and prints."""

    def __init__(self, env: dict[str, str], tmp: Path, *args: str, name: str = "w") -> None:
        super().__init__(env, tmp, *args, name=name)
        pattern = r"(?:health|metrics) on (http://[^/\s]+)"
        wait_until(
            lambda: re.search(pattern, self.output()) or self.proc.poll() is not None, TIMEOUT
        )
        found = re.search(pattern, self.output())
        assert found, self.output()
        self.base = found.group(1)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=30) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError as exc:  # no answer at all: say what the child said and how it ended
            raise AssertionError(
                f"GET {path}: {exc}; the child (exit {self.proc.poll()}) said:\n{self.output()}"
            ) from exc

    def status(self, path: str) -> int:
        return self.get(path)[0]

    def kill(self) -> None:
        """Stop it gracefully (SIGTERM), then kill it if it does not exit."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def workers(children: Start) -> Start:
    return lambda *args, name="w": children(*args, name=name, kind=Probed)


def _running(trace: Path) -> bool:
    return trace.exists() and trace.read_text().count("\n") >= 1


def test_a_healthy_worker_answers_200_on_its_own_health_port(workers) -> None:
    w = workers("workerapp.WorkItems", "--health-port", "0", "-v1")
    wait_until(lambda: w.status("/readyz") == 200, TIMEOUT)
    assert w.get("/livez") == (200, "ok\n")
    assert w.get("/readyz") == (200, "ok\n")
    WorkItems.send(id="one", payload={})
    wait_until(lambda: WorkLog.objects.filter(key="one").exists(), TIMEOUT)
    assert w.status("/livez") == 200
    assert w.status("/metrics") == 404  # metrics are off: the probes only


def test_readyz_is_503_while_the_worker_stops_and_livez_stays_200(workers, tmp_path) -> None:
    trace, release = tmp_path / "trace", tmp_path / "release"
    w = workers("workerapp.WorkItems", "--health-port", "0", "-v1")
    wait_until(lambda: w.status("/readyz") == 200, TIMEOUT)
    # A receiver outside a transaction (atomic=False): an atomic one would hold its write
    # transaction open while it blocks, and on a database with one writer at a time (SQLite,
    # the emulator) the worker's own next write waits behind it; its main thread then sat in
    # that call and ran the SIGTERM handler only once the receiver gave up (120 s; the worker
    # how-to says so of stuck atomic receivers). What this test pins is the probes.
    WorkItems.send(
        id="slow", payload={"mode": "external", "trace": str(trace), "block": str(release)}
    )
    wait_until(lambda: _running(trace), TIMEOUT)
    w.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: w.status("/readyz") == 503, TIMEOUT)
    status, body = w.get("/readyz")
    assert (status, body.split(":")[0]) == (503, "stopping")
    assert w.status("/livez") == 200  # draining its in-flight message: alive
    release.touch()
    assert w.proc.wait(TIMEOUT) == 0
    assert WorkLog.objects.filter(key="slow").count() == 1
    assert api.receive(WorkItems) == []


def test_livez_is_503_while_a_receiver_is_past_its_limit(workers, tmp_path) -> None:
    trace, release = tmp_path / "trace", tmp_path / "release"
    w = workers("workerapp.WorkItems", "--health-port", "0", "--health-max-run", "0.5", "-v1")
    wait_until(lambda: w.status("/livez") == 200, TIMEOUT)
    WorkItems.send(id="stuck", payload={"trace": str(trace), "block": str(release)})
    wait_until(lambda: _running(trace), TIMEOUT)
    wait_until(lambda: w.status("/livez") == 503, TIMEOUT)
    _status, body = w.get("/livez")
    assert "workerapp.WorkItems" in body and "past its limit of 0.5 s" in body, body
    assert w.status("/readyz") == 503  # not live: no traffic either
    release.touch()
    wait_until(lambda: WorkLog.objects.filter(key="stuck").exists(), TIMEOUT)
    wait_until(lambda: w.status("/livez") == 200, TIMEOUT)


def test_the_metrics_port_serves_the_probes_and_the_metrics(workers) -> None:
    pytest.importorskip("prometheus_client")
    w = workers("workerapp.WorkItems", "--metrics-port", "0", "-v0")
    wait_until(lambda: w.status("/readyz") == 200, TIMEOUT)
    assert w.get("/livez") == (200, "ok\n")
    status, text = w.get("/metrics")
    assert status == 200 and "spanner_queues_worker_in_flight_messages" in text

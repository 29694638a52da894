"""The probe and metrics HTTP server of a worker (``worker.health.serve``): only ``/metrics``,
``/livez`` and ``/readyz`` answer, every other path is 404; an idle connection is closed after
the read timeout and the connections served at once are capped (one thread each)."""

from __future__ import annotations

import http.client
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spanner_queues.worker import WorkerEvent
from spanner_queues.worker.health import WorkerHealth, serve

pytestmark = pytest.mark.engine_independent  # an HTTP server over WorkerHealth; no database


def _metrics(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"# TYPE x counter\n"]


@pytest.fixture
def live_health() -> WorkerHealth:
    health = WorkerHealth()
    health(WorkerEvent(name="worker_started", worker_id="w"))
    return health


@pytest.fixture
def server(live_health: WorkerHealth) -> Iterator[int]:
    srv, port = serve(0, "127.0.0.1", live_health, _metrics, read_timeout=0.5, max_connections=8)
    yield port
    srv.shutdown()
    srv.server_close()


def _get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def test_only_metrics_livez_and_readyz_answer_on_the_metrics_port(server: int) -> None:
    assert _get(server, "/metrics") == 200
    assert _get(server, "/livez") == 200
    for path in ("/", "/healthz", "/livez/", "/readyz/", "/metrics/", "/metricsx", "/favicon.ico"):
        assert _get(server, path) == 404, path


def test_the_shipped_manifest_probes_and_scrapes_paths_that_can_answer_200() -> None:
    root = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
    paths = []
    for doc in yaml.safe_load_all((root / "worker.yaml").read_text()):
        spec = (doc or {}).get("spec", {})
        for container in spec.get("template", {}).get("spec", {}).get("containers", []):
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                if probe in container:
                    paths.append(container[probe]["httpGet"]["path"])
        paths += [e["path"] for e in spec.get("podMetricsEndpoints", [])]
    assert paths and set(paths) <= {"/metrics", "/livez", "/readyz"}, paths


def test_an_idle_connection_is_closed_after_the_read_timeout(server: int) -> None:
    with socket.create_connection(("127.0.0.1", server), timeout=10) as idle:
        assert idle.recv(1) == b""  # the server closed it; before: blocked for ever
    assert _get(server, "/livez") == 200


def test_idle_connections_are_capped_and_probes_answer_once_they_time_out(server: int) -> None:
    before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", server), timeout=10) for _ in range(200)]
    try:
        # the connections beyond the cap are closed at once (before: one thread each, for ever)
        closed: set[socket.socket] = set()
        deadline = time.monotonic() + 5
        while len(closed) < 200 - 8 and time.monotonic() < deadline:
            readable, _, _ = select.select([s for s in idle if s not in closed], [], [], 0.1)
            closed |= {s for s in readable if s.recv(1) == b""}
        assert len(closed) >= 200 - 8
        assert threading.active_count() <= before + 8
        for s in idle:  # the rest once their read timeout passed
            assert s.recv(1) == b""
    finally:
        for s in idle:
            s.close()
    assert _get(server, "/livez") == 200

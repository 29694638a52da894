"""The probe and metrics HTTP server of a worker (``worker.health.serve``): only ``/metrics``,
``/livez`` and ``/readyz`` answer, every other path is 404; a connection is closed when its whole
request has not come within the read timeout, the connections held are capped (the oldest
closed first), and probes answer while hundreds of slow connections trickle their requests."""

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


def _answers(port: int, path: str) -> int | str:
    """The probe's status, or why it got none (the connection refused or closed unanswered)."""
    try:
        return _get(port, path)
    except (OSError, http.client.HTTPException) as exc:
        return type(exc).__name__


def test_probes_answer_while_300_slow_connections_trickle_their_requests(
    live_health: WorkerHealth,
) -> None:
    # the attack: each connection sends a byte of a request now and then, never finishing it
    # (before: the read timeout was per read, 16 such connections held every thread for good,
    # and each further connection, the probes included, was closed unanswered)
    srv, port = serve(0, "127.0.0.1", live_health)  # the shipped defaults
    slow = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(300)]
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.2):
            for s in slow:
                try:
                    s.send(b"G")
                except OSError:
                    pass

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        answers = [_answers(port, "/livez") for _ in range(20)]
    finally:
        stop.set()
        trickler.join()
        for s in slow:
            s.close()
        srv.shutdown()
        srv.server_close()
    assert answers == [200] * 20


def test_a_trickling_connection_is_closed_at_the_request_deadline(server: int) -> None:
    # the deadline is the whole request's (0.5 s here), not each read's
    with socket.create_connection(("127.0.0.1", server), timeout=10) as conn:
        start = time.monotonic()
        closed = False
        while not closed and time.monotonic() - start < 8:
            try:
                conn.send(b"G")
            except OSError:
                closed = True
                break
            readable, _, _ = select.select([conn], [], [], 0.1)
            try:
                closed = bool(readable) and conn.recv(1) == b""
            except ConnectionResetError:
                # the server closed with our unread bytes in its buffer: the kernel sends RST,
                # not FIN; the connection was closed all the same
                closed = True
        assert closed


def test_past_the_cap_the_oldest_connection_is_closed_not_the_newest(server: int) -> None:
    held = [socket.create_connection(("127.0.0.1", server), timeout=10) for _ in range(12)]
    try:
        fresh = held[-8:]
        for s in held[:4]:  # the four oldest make room for the newest (cap 8)
            assert s.recv(1) == b""
        fresh[-1].sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        assert fresh[-1].recv(64).startswith(b"HTTP/1.1 200")
    finally:
        for s in held:
            s.close()

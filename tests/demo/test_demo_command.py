"""``bin/demo`` as a person runs it: it migrates, prints a login, serves the admin, processes
messages, and stops cleanly (exit 0, no orphans, heartbeat deleted) on SIGTERM/SIGINT to its
process group."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.process, pytest.mark.slow]


def _packing_slips(var: Path) -> int:
    """Packing slips the shipping service prepared from Pub/Sub (0 before its table exists)."""
    try:
        with sqlite3.connect(var / "demo-project.sqlite3") as db:
            return db.execute("SELECT COUNT(*) FROM shipping_packingslip").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_demo_serves_the_admin_and_stops_cleanly(tmp_path: Path, signum: int) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "SQ_", "PUBSUB_EMULATOR_HOST"))
    }
    env.update(DEMO_DATABASE="sqlite", DEMO_VAR_DIR=str(tmp_path), DEMO_REPORT_ROW_SECONDS="0.005")
    proc = subprocess.Popen(
        [str(ROOT / "bin" / "demo"), "--port", "0", "--rate", "20"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        banner = wait_until(
            lambda: (
                next((line for line in lines if "/admin/spanner_queues/queues/" in line), None)
                or (proc.poll() is not None and pytest.fail("".join(lines)))
            ),
            timeout=180,
        )
        url = re.search(r"(http://127\.0\.0\.1:\d+)/", banner).group(1)  # type: ignore[union-attr]
        assert wait_until(lambda: any(line.strip().startswith("password:") for line in lines))
        with urllib.request.urlopen(f"{url}/admin/login/", timeout=30) as response:
            assert response.status == 200 and b"Django" in response.read()
        pids = [int(p) for p in re.findall(r"pid (\d+)", "".join(lines))]
        # web server, worker, and the Pub/Sub emulator the demo started when it is installed
        assert len(pids) == 2 + settings.DEMO_PUBSUB
        # The worker processes messages: the admin's welcome email is written to var/.
        wait_until(lambda: any((tmp_path / "sent-emails").glob("*.log")), timeout=60)
        if settings.DEMO_PUBSUB:  # two services: an order's event came through Pub/Sub
            wait_until(lambda: _packing_slips(tmp_path) > 0, timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signum)
        proc.wait(timeout=120)
    reader.join(30)
    output = "".join(lines)
    assert proc.returncode == 0, output
    assert "Stopped (web server exit 0, worker exit 0)" in output
    if settings.DEMO_PUBSUB:
        assert f"Stopped the Pub/Sub emulator (pid {pids[2]})" in output
    wait_until(lambda: not any(_alive(pid) for pid in pids), timeout=30)
    with sqlite3.connect(tmp_path / "demo-project.sqlite3") as db:
        live = db.execute(
            "SELECT worker_id FROM ops_workerheartbeats"
            " WHERE worker_id NOT LIKE 'simulated-crash-%'"
        ).fetchall()
    assert live == []  # the worker deleted its heartbeat on the way out

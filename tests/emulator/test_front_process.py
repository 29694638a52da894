"""``python -m spanner_queues_emulator`` as a person runs it: ready line, clients connect with
SPANNER_EMULATOR_HOST, SIGTERM/SIGINT stop the front and the emulator, nothing left running;
and the E007 probe that tells the front from Google's plain emulator."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spanner_queues.engines.native.client import emulator_has_queues
from spanner_queues_emulator import start_emulator


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_command_serves_queues_and_stops_cleanly(signum: int) -> None:
    env = dict(os.environ)
    env.pop("SPANNER_EMULATOR_HOST", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "spanner_queues_emulator", "--host-port", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("ready 127.0.0.1:"), line
        host = line.split()[1]
        emulators = children(proc.pid)
        assert emulators, "emulator_main runs as the front's child"
        assert emulator_has_queues(host)
        script = (
            "from google.cloud import spanner\n"
            "from spanner_queues_emulator import ensure_instance\n"
            "ensure_instance('cli-inst')\n"
            "db = spanner.Client(project='test-project').instance('cli-inst').database("
            "'clidb', ddl_statements=['CREATE QUEUE Q (Id INT64 NOT NULL, Payload STRING(MAX) "
            "NOT NULL) PRIMARY KEY (Id)'])\n"
            "db.create().result(60)\n"
            "with db.batch() as b:\n    b.send(queue='Q', key=(1,), payload='hi')\n"
            "with db.snapshot() as s:\n"
            '    print(list(s.execute_sql("SELECT Id, Payload FROM RECEIVE_Q(max_duration => '
            "'1s')\")))\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", script],
            env={**env, "SPANNER_EMULATOR_HOST": host, "GOOGLE_CLOUD_PROJECT": "test-project"},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        assert out.strip() == "[[1, 'hi']]"
        proc.send_signal(signum)
        assert proc.wait(30) == 0
        assert not [pid for pid in emulators if alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_plain_emulator_has_no_queues() -> None:
    host, proc = start_emulator()
    try:
        assert not emulator_has_queues(host)
    finally:
        proc.terminate()
        proc.wait(10)

"""The front as a server (issue 20, item 13): it owns its port or fails, it does not outlive
its emulator in silence, and ``--host-port`` takes only a host and a port."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from typing import Any

import grpc
import pytest

from spanner_queues_emulator import QueueEmulator
from spanner_queues_emulator.front import AddressInUse, serve
from tests.conftest import wait_until
from tests.emulator.test_front_process import children

COMMAND = [sys.executable, "-m", "spanner_queues_emulator"]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SPANNER_EMULATOR_HOST", None)
    return env


def describe(host: str) -> grpc.RpcError | bytes:
    """The front's own Describe call: its answer, or the error it ends with."""
    with grpc.insecure_channel(host) as channel:
        call = channel.unary_unary("/spanner_queues.emulator.Front/Describe")
        try:
            return call(b"", timeout=5)
        except grpc.RpcError as exc:
            return exc


# --- (a) one front per port ------------------------------------------------------------------
def test_a_second_front_on_a_taken_port_fails_to_start() -> None:
    taken = os.environ["SPANNER_EMULATOR_HOST"]  # the suite's own front
    with pytest.raises(AddressInUse, match=f"cannot listen on {taken}"):
        serve("127.0.0.1:1", taken)


def test_the_command_on_a_taken_port_exits_with_an_error() -> None:
    taken = os.environ["SPANNER_EMULATOR_HOST"]
    proc = subprocess.run(
        [*COMMAND, "--host-port", taken],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert not proc.stdout.startswith("ready")
    assert f"cannot listen on {taken}" in proc.stderr


# --- (b) a dead emulator ---------------------------------------------------------------------
def test_the_front_reports_its_dead_emulator(caplog: Any) -> None:
    caplog.set_level(logging.ERROR, logger="spanner_queues_emulator")
    emulator = QueueEmulator().start()
    try:
        assert isinstance(describe(emulator.host), bytes)
        assert emulator._emulator is not None
        emulator._emulator.kill()
        assert emulator.failed.wait(30)
        error = wait_until(lambda: describe(emulator.host))
        assert isinstance(error, grpc.RpcError)
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert "emulator_main exited" in (error.details() or "")
        assert any("emulator_main exited" in r.getMessage() for r in caplog.records)
    finally:
        emulator.stop()


def test_the_command_exits_non_zero_when_its_emulator_dies() -> None:
    proc = subprocess.Popen(
        [*COMMAND, "--host-port", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("ready ")
        [emulator] = children(proc.pid)
        os.kill(emulator, signal.SIGKILL)
        code = proc.wait(30)
        assert code != 0
        assert proc.stderr is not None
        assert "emulator_main exited" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# --- (h) --host-port -------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["127.0.0.1", "127.0.0.1:99999", "127.0.0.1:-5", "localhost:"])
def test_host_port_needs_a_host_and_a_valid_port(value: str) -> None:
    proc = subprocess.run(
        [*COMMAND, "--exit-with-parent", f"--host-port={value}"],
        env=environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2  # argparse's usage error
    assert "--host-port" in proc.stderr and "HOST:PORT" in proc.stderr
    assert proc.stdout == ""  # nothing started


def test_listening_beyond_loopback_prints_a_warning() -> None:
    proc = subprocess.Popen(
        [*COMMAND, "--host-port", "0.0.0.0:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(),
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith("ready 0.0.0.0:")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        warning = proc.stderr.read()
        assert "warning" in warning and "unauthenticated" in warning
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

"""Private Cloud Spanner emulator processes for tests and local development.

``start_emulator()`` runs Google's ``emulator_main`` on a free loopback port;
``start_queue_emulator()`` runs ``python -m spanner_queues_emulator`` (the emulator behind the
queue-aware front) and waits for its ready line. Both stop when this interpreter exits, and
with their parent on Linux.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

CANDIDATES = (
    "/usr/lib/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
    "/usr/share/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
    "/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main",
)


class EmulatorNotFound(RuntimeError):
    """No ``emulator_main`` binary (Debian package google-cloud-cli-spanner-emulator)."""


def find_emulator() -> str:
    configured = os.environ.get("SPANNER_EMULATOR_BINARY")
    if configured:
        return configured
    for candidate in CANDIDATES:
        if Path(candidate).is_file():
            return candidate
    found = shutil.which("emulator_main")
    if found:
        return found
    try:
        listing = subprocess.run(
            ["dpkg", "-L", "google-cloud-cli-spanner-emulator"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    except OSError:
        listing = ""
    for line in listing.splitlines():
        if line.endswith("/emulator_main"):
            return line
    raise EmulatorNotFound(
        "emulator_main not found: install the Debian package google-cloud-cli-spanner-emulator "
        "or set SPANNER_EMULATOR_BINARY."
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def terminate(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM ``proc`` and reap it; SIGKILL it if it has not ended within ``timeout``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _stop_at_exit(proc: subprocess.Popen[bytes]) -> None:
    atexit.register(terminate, proc)


def start_emulator() -> tuple[str, subprocess.Popen[bytes]]:
    """Start ``emulator_main`` on a free loopback port; return (host:port, process)."""
    binary = find_emulator()
    port = free_port()
    host = f"127.0.0.1:{port}"
    proc = subprocess.Popen(
        [binary, "--host_port", host],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"emulator_main exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.02)
    else:
        proc.kill()
        raise RuntimeError("emulator_main did not open its port within 30 s")
    _stop_at_exit(proc)
    return host, proc


def start_queue_emulator() -> tuple[str, subprocess.Popen[bytes]]:
    """Start ``python -m spanner_queues_emulator`` on a free loopback port (the emulator behind
    the queue-aware front); return (host:port, process) once it says it is ready."""
    find_emulator()  # fail here, with the clear error, when the binary is missing
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spanner_queues_emulator",
            "--host-port",
            "127.0.0.1:0",
            "--exit-with-parent",
        ],
        stdout=subprocess.PIPE,
        stderr=None,
        preexec_fn=_die_with_parent,
        start_new_session=True,  # a Ctrl-C meant for the program does not stop its database
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("ready "):
        proc.kill()
        raise RuntimeError(f"the queue emulator did not start: {line!r}")
    _stop_at_exit(proc)
    return line.split()[1], proc


def ensure_instance(instance_id: str, project: str = "test-project") -> None:
    """Create the emulator instance if it does not exist."""
    from google.api_core.exceptions import AlreadyExists
    from google.cloud import spanner

    client = spanner.Client(project=project)
    instance = client.instance(
        instance_id,
        configuration_name=f"{client.project_name}/instanceConfigs/emulator-config",
        node_count=1,
    )
    try:
        instance.create().result(60)
    except AlreadyExists:
        pass


def ensure_database(instance_id: str, database_id: str, project: str = "test-project") -> None:
    from google.api_core.exceptions import AlreadyExists
    from google.cloud import spanner

    client = spanner.Client(project=project)
    try:
        client.instance(instance_id).database(database_id).create().result(60)
    except AlreadyExists:
        pass


def ensure_emulator(
    instance_id: str, project: str = "test-project", *, queues: bool = False
) -> str:
    """Return the emulator address, starting one if ``SPANNER_EMULATOR_HOST`` is unset: Google's
    plain emulator, or with ``queues`` the emulator behind the queue-aware front."""
    host = os.environ.get("SPANNER_EMULATOR_HOST")
    if not host:
        host, _ = start_queue_emulator() if queues else start_emulator()
        os.environ["SPANNER_EMULATOR_HOST"] = host
    os.environ.setdefault("GOOGLE_CLOUD_PROJECT", project)
    ensure_instance(instance_id, project)
    return host

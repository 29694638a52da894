"""A private PostgreSQL server for the test suite (``tests.settings_postgres``).

``ensure_postgres()`` starts a throw-away cluster (``initdb`` in a temporary directory, trust
authentication on loopback only, a free port) and stops it when this process exits, unless
``SQ_PG_PORT`` says one is already running (child processes of the suite inherit it). PostgreSQL
refuses to run as root: when this process is root, the cluster runs as ``SQ_PG_USER`` (default
``nobody``), which owns the temporary directory.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SUPERUSER = "postgres"


class PostgresNotFound(RuntimeError):
    """No PostgreSQL server binaries (``initdb``, ``pg_ctl``) were found."""


def find_postgres() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl``: ``SQ_PG_BIN``, Debian's
    ``/usr/lib/postgresql/<version>/bin`` (newest first), or ``PATH``."""
    candidates = [os.environ.get("SQ_PG_BIN", "")]
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).parent))
    for directory in filter(None, candidates):
        if (Path(directory) / "initdb").exists() and (Path(directory) / "pg_ctl").exists():
            return Path(directory)
    raise PostgresNotFound(
        "PostgreSQL server binaries not found: install Debian's 'postgresql' package or set "
        "SQ_PG_BIN to the directory holding initdb and pg_ctl."
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> dict[str, object]:
    """subprocess arguments that drop root (PostgreSQL will not run as root)."""
    if os.geteuid() != 0:
        return {}
    user = pwd.getpwnam(os.environ.get("SQ_PG_USER", "nobody"))
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _owned_tempdir(run_as: dict[str, object]) -> Path:
    path = Path(tempfile.mkdtemp(prefix="sq-postgres-"))
    if run_as:
        os.chown(path, int(run_as["user"]), int(run_as["group"]))  # type: ignore[call-overload]
    return path


def ensure_postgres() -> tuple[str, int]:
    """(host, port) of a running server: the one named by ``SQ_PG_PORT``, or a new private one
    stopped at exit."""
    if os.environ.get("SQ_PG_PORT"):
        return os.environ.get("SQ_PG_HOST", "127.0.0.1"), int(os.environ["SQ_PG_PORT"])
    bindir = find_postgres()
    run_as = _run_as()
    root = _owned_tempdir(run_as)
    data = root / "data"
    port = _free_port()
    env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C.UTF-8", "HOME": str(root)}
    common = {"cwd": root, "env": env, "check": True, "capture_output": True, **run_as}
    subprocess.run(
        [bindir / "initdb", "-D", data, "-U", SUPERUSER, "--auth=trust", "-E", "UTF8"],
        **common,  # type: ignore[arg-type]
    )
    options = (
        f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root} "
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
    )
    subprocess.run(
        [bindir / "pg_ctl", "-D", data, "-o", options, "-l", root / "server.log", "-w", "start"],
        **common,  # type: ignore[arg-type]
    )

    def stop() -> None:
        subprocess.run(
            [bindir / "pg_ctl", "-D", data, "-m", "fast", "-w", "stop"],
            cwd=root,
            env=env,
            capture_output=True,
            check=False,
            **run_as,  # type: ignore[arg-type]
        )
        shutil.rmtree(root, ignore_errors=True)

    atexit.register(stop)
    _wait_ready(port)
    os.environ["SQ_PG_HOST"] = "127.0.0.1"
    os.environ["SQ_PG_PORT"] = str(port)  # child processes use this server, never stop it
    return "127.0.0.1", port


def _wait_ready(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)

"""How long a SIGTERM takes to stop a worker whose receiver never returns (blocked in a C call,
inside its atomic transaction), with ``--timeout`` and ``--stuck-grace``: the stated bound is the
time limit left plus the grace. One ``runqueueworker`` child on a fresh SQLite file.

    .venv/bin/python benchmarks/stuck_stop_time.py --timeout 5 --stuck-grace 10
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--stuck-grace", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sq-stuck-") as tmp:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "SQ_DATABASE_NAME": str(Path(tmp) / "db.sqlite3"),
            "PYTHONPATH": str(ROOT),
        }
        manage = [sys.executable, "-m", "django"]
        subprocess.run([*manage, "migrate", "-v0"], env=env, cwd=ROOT, check=True)
        trace = Path(tmp) / "trace"
        send = (
            "from tests.workerapp.models import WorkItems; "
            f"WorkItems.send(id='hung', payload={{'hang': 'x', 'trace': {str(trace)!r}}})"
        )
        subprocess.run([*manage, "shell", "-c", send], env=env, cwd=ROOT, check=True)
        worker = subprocess.Popen(
            [*manage, "runqueueworker", "workerapp.WorkItems", "-v0",
             "--timeout", str(args.timeout), "--stuck-grace", str(args.stuck_grace)],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        while not trace.exists():
            time.sleep(0.01)
        started = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        status = worker.wait(300)
        took = time.monotonic() - started
    print(
        f"SIGTERM right after the receiver started: exit {status} after {took:.1f} s "
        f"(bound: --timeout {args.timeout:g} + --stuck-grace {args.stuck_grace:g} = "
        f"{args.timeout + args.stuck_grace:g} s)"
    )


if __name__ == "__main__":
    main()

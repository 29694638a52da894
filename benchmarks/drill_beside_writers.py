"""How long an ordinary ``send`` waits beside a running fault drill (``queuedrill``) on one
SQLite file: the drill's receivers hold SQLite's only write lock while they run.

    .venv/bin/python benchmarks/drill_beside_writers.py                  # --work-ms 10 (default)
    .venv/bin/python benchmarks/drill_beside_writers.py --work-ms 1000

A fresh SQLite file under a temporary directory (``tests.settings``: WAL, IMMEDIATE, busy
timeout 20 s); ``queuedrill --allow-shared-database`` with the defaults (1000 messages, 3
workers x 2 threads, 5 kills) plus the arguments given, in a child process; meanwhile this
process sends one ``testapp.UserTasks`` message every 0.1 s, each in its own transaction, and
prints the longest and the median wait, and the errors, once the drill has ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(args: list[str]) -> None:
    work = Path(tempfile.mkdtemp(prefix="drill-beside-"))
    os.environ["SQ_DATABASE_NAME"] = str(work / "db.sqlite3")
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["PYTHONPATH"] = str(ROOT)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    from tests.testapp.models import UserTasks

    call_command("migrate", verbosity=0)
    drill = subprocess.Popen(
        [
            *(sys.executable, "-m", "django", "queuedrill", "--allow-shared-database", "-v0"),
            *("--report-dir", str(work / "report"), *args),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    waits: list[float] = []
    errors: list[str] = []
    n = 0
    while drill.poll() is None:
        n += 1
        began = time.monotonic()
        try:
            UserTasks.send(user_id=n, message_id="m", payload="x")
            waits.append(time.monotonic() - began)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc} after {time.monotonic() - began:.2f} s")
        time.sleep(0.1)
    print((drill.stdout.read() if drill.stdout else "").strip())
    waits.sort()
    print(
        f"sends beside the drill: {len(waits)} ok, {len(errors)} failed; longest wait "
        f"{waits[-1]:.2f} s, median {waits[len(waits) // 2] * 1000:.1f} ms"
    )
    for error in errors[:3]:
        print(" ", error)


if __name__ == "__main__":
    main(sys.argv[1:])

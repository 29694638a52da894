"""What ``QueueMeta.rate_limit`` costs: the shared bucket's take (``controls.take_starts``), one
short read-write transaction per receive of a rate-limited queue, on SQLite, PostgreSQL and the
Spanner emulator. Each backend runs in a child process on a fresh database (``core._setup``).

    .venv/bin/python benchmarks/rate_limit_cost.py              # sqlite, postgres, emulator
    .venv/bin/python benchmarks/rate_limit_cost.py --backends sqlite --takes 500

A worker takes starts once per receive of up to ``want`` messages (its free slots), so a take
costs ``1 / want`` of its latency per message; an idle worker takes once per second per
rate-limited queue (its unused starts lapse after ``RATE_BURST_SECONDS``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def child(backend: str, takes: int) -> None:
    from benchmarks.core import _setup

    with tempfile.TemporaryDirectory(prefix="sq-rate-") as workdir:
        if backend == "postgres":
            info = _setup_postgres()
        else:
            info = _setup(backend, workdir)
        from spanner_queues import controls
        from tests.testapp.models import UserTasks

        result = {"backend": backend, "info": info}
        for want in (1, 10):
            controls.take_starts(UserTasks, want, 1e9)  # warm up: creates the bucket row
            samples = []
            for _ in range(takes):
                started = time.perf_counter()
                granted, _ = controls.take_starts(UserTasks, want, 1e9)
                samples.append(time.perf_counter() - started)
                assert granted == want
            p50 = statistics.median(samples) * 1000
            result[f"want{want}"] = {
                "p50_ms": round(p50, 3),
                "per_message_ms": round(p50 / want, 3),
            }
    print("RESULT " + json.dumps(result), flush=True)


def _setup_postgres() -> dict[str, str]:
    """A private PostgreSQL cluster (``tests.postgres_server``), migrated."""
    from tests.postgres_server import ensure_postgres

    ensure_postgres()
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["SQ_BENCH_DATABASE"] = "postgres"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
    return {"database": f"PostgreSQL {version}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgres", "emulator"])
    parser.add_argument("--takes", type=int, default=200)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.takes)
        return
    rows = []
    for backend in args.backends:
        cmd = [sys.executable, __file__, "--child", backend, "--takes", str(args.takes)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=os.environ)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            sys.stderr.write(proc.stdout + proc.stderr)
            raise SystemExit(f"{backend} failed")
        rows.append(json.loads(lines[-1][7:]))
    print("| backend | one take, p50 | per message at want=1 | per message at want=10 |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['backend']} ({r['info']['database']}) | {r['want1']['p50_ms']} ms | "
            f"{r['want1']['per_message_ms']} ms | {r['want10']['per_message_ms']} ms |"
        )


if __name__ == "__main__":
    main()

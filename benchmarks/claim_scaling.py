"""Claim scaling: drain one queue with 1, 2 and 4 claimer processes, and count aborted claims.

    .venv/bin/python benchmarks/claim_scaling.py                      # PostgreSQL and the emulator
    .venv/bin/python benchmarks/claim_scaling.py --backend postgres --depth 5000
    .venv/bin/python benchmarks/claim_scaling.py --backend emulator --depth 300 --batch 1
    .venv/bin/python benchmarks/claim_scaling.py --backend emulator --claim-window 0   # head
    .venv/bin/python benchmarks/claim_scaling.py --backend postgres --no-skip-locked

Each backend gets a private server for the run: a PostgreSQL cluster (``tests.postgres_server``:
``initdb`` in a temporary directory, ``fsync=off``) or an ``emulator_main`` on a free port
(``SPANNER_EMULATOR_HOST`` is ignored). The table engine, ``benchmarks/settings.py``, the queue
``tests.testapp.models.Jobs``.

For each N in ``--workers`` (1, 2, 4): the queue is filled with ``--depth`` messages, N
processes start and connect, and on one signal each loops ``receive(max_messages=--batch)`` then
``ack`` (``ack_many`` for batches) in its own ``atomic()`` until the queue is empty. Printed per
N: the drain rate (messages / wall time from the signal to the last process done), its ratio to
N=1, and the aborted transactions per message: ``run_in_transaction`` retries (the claim's
ABORTED / serialization failures / "locked") plus, on Spanner, the transactions the DB-API
replayed by itself after an abort. Claim processes are not the worker (no prefetch, no threads):
this measures the claim and the ack, not the worker's intake.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEPTH = {"postgres": 4000, "emulator": 300}  # the emulator scans whole tables


def _django(backend: str) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["SQ_BENCH_DATABASE"] = backend
    import django

    django.setup()


def _count_dbapi_replays() -> list[int]:
    """Count the transactions django_spanner's DB-API replays after an ABORTED commit."""
    replays = [0]
    try:
        from google.cloud.spanner_dbapi.transaction_helper import TransactionRetryHelper
    except ImportError:
        return replays
    original = TransactionRetryHelper.retry_transaction

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        replays[0] += 1
        return original(self, *args, **kwargs)

    TransactionRetryHelper.retry_transaction = counted  # type: ignore[method-assign]
    return replays


def claimer(backend: str, batch: int, skip_locked: bool, window: int | None) -> None:
    """One claim process: connect, say READY, wait for GO, drain, print RESULT."""
    _django(backend)
    from spanner_queues import drivers

    if not skip_locked:  # to compare: claims that wait on each other's rows
        drivers.Driver.claims_skip_locked = property(lambda self: False)  # type: ignore[assignment]
    if window is not None:  # 0: every claim reads the head of the DeliverTime index
        for driver in (drivers.Driver, drivers.SpannerDriver):
            driver.claim_window = window
    from django.db import transaction

    from spanner_queues import api
    from spanner_queues.transactions import retry_counts
    from tests.testapp.models import Jobs

    replays = _count_dbapi_replays()
    Jobs.objects.exists()  # connect before the clock starts
    print("READY", flush=True)
    sys.stdin.readline()
    done = empty = 0
    while True:
        messages = api.receive(Jobs, max_messages=batch)
        if not messages:
            empty += 1
            if not Jobs.objects.exists():
                break
            continue
        with transaction.atomic():
            if len(messages) == 1:
                api.ack(messages[0])
            else:
                api.ack_many(Jobs, messages)
        done += len(messages)
    result = {
        "messages": done,
        "retries": retry_counts().get("default", 0),
        "replays": replays[0],
        "empty_receives": empty,
    }
    print("RESULT " + json.dumps(result), flush=True)


def _fill(depth: int) -> None:
    from tests.testapp.models import Jobs

    Jobs.objects.all().delete()
    for start in range(0, depth, 500):
        Jobs.send_many([{"payload": {"n": n}} for n in range(start, min(start + 500, depth))])


def _drain(backend: str, workers: int, depth: int, batch: int, extra: list[str]) -> dict[str, Any]:
    from django.db import connections

    _fill(depth)
    connections.close_all()
    cmd = [sys.executable, __file__, "--claimer", backend, "--batch", str(batch), *extra]
    procs = [
        subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(workers)
    ]
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        if line.strip() != "READY":
            raise SystemExit(f"claimer failed to start: {line!r}")
    started = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("GO\n")
        p.stdin.flush()
    results = []
    for p in procs:
        out, _ = p.communicate()
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            raise SystemExit(f"claimer failed (exit {p.returncode}): {out}")
        results.append(json.loads(lines[-1][len("RESULT ") :]))
    elapsed = time.perf_counter() - started
    messages = sum(r["messages"] for r in results)
    return {
        "workers": workers,
        "messages": messages,
        "seconds": elapsed,
        "per_second": messages / elapsed,
        "retries_per_message": sum(r["retries"] for r in results) / max(messages, 1),
        "replays_per_message": sum(r["replays"] for r in results) / max(messages, 1),
        "empty_receives": sum(r["empty_receives"] for r in results),
    }


def _start(backend: str) -> str:
    if backend == "postgres":
        from tests.postgres_server import ensure_postgres

        os.environ.pop("SQ_PG_PORT", None)  # always a private cluster
        host, port = ensure_postgres()
        return f"PostgreSQL at {host}:{port} (fsync=off)"
    from spanner_queues_emulator import ensure_database, ensure_emulator

    os.environ.pop("SPANNER_EMULATOR_HOST", None)
    instance, database = "sq-bench", f"sqscale{os.getpid()}"
    os.environ["SQ_BENCH_SPANNER_INSTANCE"] = instance
    os.environ["SQ_BENCH_SPANNER_DATABASE"] = database
    host = ensure_emulator(instance)
    ensure_database(instance, database)
    return f"Spanner emulator at {host}"


def run_backend(backend: str, workers: list[int], depth: int, batch: int, extra: list[str]) -> str:
    sys.path.insert(0, str(ROOT))
    where = _start(backend)
    _django(backend)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    lines = [f"{where}; depth {depth}, batch {batch}, {os.cpu_count()} CPUs {' '.join(extra)}"]
    lines.append(
        f"{'workers':>7} {'msg/s':>9} {'vs 1':>6} {'aborted txn/msg':>16} "
        f"{'(claim retries':>15} {'+ DB-API replays)':>18} {'empty receives':>15}"
    )
    base = None
    for n in workers:
        r = _drain(backend, n, depth, batch, extra)
        base = base or r["per_second"]
        lines.append(
            f"{n:>7} {r['per_second']:>9.0f} {r['per_second'] / base:>5.2f}x "
            f"{r['retries_per_message'] + r['replays_per_message']:>16.3f} "
            f"{r['retries_per_message']:>15.3f} {r['replays_per_message']:>18.3f} "
            f"{r['empty_receives']:>15}"
        )
        print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["postgres", "emulator"], action="append")
    parser.add_argument("--workers", default="1,2,4", help="claimer process counts (1,2,4)")
    parser.add_argument("--depth", type=int, default=None, help="messages per drain")
    parser.add_argument("--batch", type=int, default=1, help="max_messages per receive (1)")
    parser.add_argument(
        "--no-skip-locked", action="store_true", help="PostgreSQL claims without SKIP LOCKED"
    )
    parser.add_argument(
        "--claim-window", type=int, default=None, help="override Driver.claim_window (0: head)"
    )
    parser.add_argument("--claimer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.claimer:
        claimer(args.claimer, args.batch, not args.no_skip_locked, args.claim_window)
        return
    extra = ["--no-skip-locked"] if args.no_skip_locked else []
    if args.claim_window is not None:
        extra += ["--claim-window", str(args.claim_window)]
    workers = [int(n) for n in args.workers.split(",")]
    command = " ".join(["python", "benchmarks/claim_scaling.py", *sys.argv[1:]])
    for backend in args.backend or ["postgres", "emulator"]:
        # one backend per process: Django is set up once per process
        if len(args.backend or []) != 1:
            cmd = [sys.executable, __file__, "--backend", backend, "--workers", args.workers]
            cmd += ["--batch", str(args.batch)]
            if args.depth:
                cmd += ["--depth", str(args.depth)]
            subprocess.run([*cmd, *extra], check=True, cwd=ROOT)
            continue
        print(run_backend(backend, workers, args.depth or DEPTH[backend], args.batch, extra))
        print(f"load average {os.getloadavg()[0]:.2f}; reproduce: {command}")


if __name__ == "__main__":
    main()

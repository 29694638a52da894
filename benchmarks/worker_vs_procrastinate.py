"""spanner_queues' worker against procrastinate's, both on PostgreSQL, one process each.

    .venv/bin/pip install -e '.[bench]' procrastinate 'psycopg[binary]'
    .venv/bin/python benchmarks/worker_vs_procrastinate.py --drain 3000 --rounds 3

One private PostgreSQL server (``tests.postgres_server``, made durable for the run: ``fsync``,
``synchronous_commit`` and ``full_page_writes`` on, as in ``sqlite_bench.postgres_database``),
one database shared by both. Each round, alternating so that a change of the machine's load
falls on both alike, drains a backlog of ``--drain`` no-op jobs:

- ``spanner_queues``: ``Worker(burst=True)`` at its defaults (concurrency 1, adaptive prefetch,
  group commit) on ``workerbench.OrderTasks`` (``benchmarks/worker_settings.py``), from the first
  receive to the empty queue;
- ``procrastinate``: ``App.run_worker(wait=False, concurrency=1)`` on its own schema (applied
  once), ``listen_notify`` off and no polling wait (a backlog), from start to the empty queue;
  its jobs deferred with ``batch_defer`` before the clock.

Prints each round's rates and the median of the rounds' ratios (issue 41's goal: the worker
drains at least 5x procrastinate with one process).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sqlite_bench  # beside this script: on sys.path when it runs

#: issue 41: the worker's drain on PostgreSQL at least this many times procrastinate's
GOAL = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--drain", type=int, default=3000, help="the backlog of each round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["SQ_BENCH_BACKEND"] = "postgres"
    with tempfile.TemporaryDirectory(prefix="sq-procrastinate-bench-") as tmp:
        sqlite_bench.setup(Path(tmp), "benchmarks.worker_settings")
        run(args.drain, args.rounds)


def run(n: int, rounds: int) -> None:
    import procrastinate

    from benchmarks.workerbench.models import OrderTasks
    from spanner_queues.worker import Worker

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=_conninfo()))

    @app.task(queue="bench", name="noop")
    def noop(i: int) -> None:
        return None

    print(
        f"# worker vs procrastinate {_version('procrastinate')}: "
        f"Python {platform.python_version()}, PostgreSQL {os.environ['SQ_BENCH_POSTGRES']} "
        f"(fsync on), {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    with app.open():
        app.schema_manager.apply_schema()
    pairs: list[tuple[float, float]] = []
    for r in range(rounds):
        for start in range(0, n, 500):
            OrderTasks.send_many([{"payload": ""} for _ in range(min(500, n - start))])
        worker = Worker(["workerbench.OrderTasks"], burst=True, install_signal_handlers=False)
        t0 = time.perf_counter()
        stats = worker.run()
        ours = n / (time.perf_counter() - t0)
        assert stats.processed == n and not OrderTasks.objects.exists(), stats

        with app.open():  # (run_worker opens and closes the app itself)
            for start in range(0, n, 500):
                noop.batch_defer(*[{"i": i} for i in range(start, min(n, start + 500))])
        t0 = time.perf_counter()
        app.run_worker(
            queues=["bench"],
            wait=False,
            concurrency=1,
            listen_notify=False,
            install_signal_handlers=False,
            delete_jobs="successful",
        )
        theirs = n / (time.perf_counter() - t0)
        left = _jobs_left()
        assert left == 0, f"procrastinate left {left} jobs"
        pairs.append((ours, theirs))
        print(
            f"  round {r + 1}: spanner_queues {ours:7.0f} msg/s, procrastinate {theirs:6.0f} "
            f"jobs/s: ratio {ours / theirs:.1f}x",
            flush=True,
        )
    ratio = statistics.median(a / b for a, b in pairs)
    met = "met" if ratio >= GOAL else "NOT MET"
    print(
        f"median ratio {ratio:.1f}x (issue 41's goal: >= {GOAL:g}x: {met}); "
        f"load {os.getloadavg()[0]:.1f}"
    )


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def _conninfo() -> str:
    from tests.postgres_server import SUPERUSER

    host_port, name = os.environ["SQ_BENCH_POSTGRES"].split("/")
    host, port = host_port.rsplit(":", 1)
    return f"host={host} port={port} user={SUPERUSER} dbname={name}"


def _jobs_left() -> int:
    """procrastinate's jobs not yet succeeded (read with psycopg, outside its app)."""
    import psycopg

    with psycopg.connect(_conninfo()) as conn:
        row = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"
        ).fetchone()
    return int(row[0]) if row else 0


if __name__ == "__main__":
    sys.exit(main())

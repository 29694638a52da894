"""Django's Tasks API on spanner_queues (``QueueBackend``) against django-tasks-db.

    .venv/bin/pip install -e '.[bench,tasks]'   # Django 5.2 (the tasks extra: the backport)
    .venv/bin/python benchmarks/tasks_vs_django_tasks_db.py
    .venv/bin/python benchmarks/tasks_vs_django_tasks_db.py --enqueue 2000 --drain 2000 --json

One machine, one run, one fresh SQLite file (WAL, ``transaction_mode="IMMEDIATE"``, persistent
connections) shared by both backends, ``benchmarks/tasks_settings.py``; the same task function
(``benchmarks.workerbench.tasks.noop``), sent to each backend with ``.using(backend=...)``:

(a) enqueue: N transactions, each ``with atomic(): Order.objects.create(...)`` plus
    ``noop.enqueue(...)``; alternating rounds of 100. Ours writes the task's message (one row,
    the result row is written when the task finishes); django-tasks-db writes its one row.
(b) drain: a backlog of N tasks run in-process, in alternating rounds (``--rounds``, default
    3): ``Worker(burst=True)`` on the task queue (per task: the claim, its lease being
    ``RUNNING``, shared by many tasks with the adaptive prefetch, then the task with its result
    row and the ack in one transaction), against
    ``db_worker --batch --no-startup-delay``.

Prints the settings each backend ran with (read back from its connection: ``journal_mode``,
``synchronous``, ``transaction_mode``, ``CONN_MAX_AGE``), the figures, and the ratios
(spanner_queues / django-tasks-db, higher is better) next to the goals (issues 23 and 29:
drain at least 5x, enqueue at least 1.0x, at defaults, on Django 5.2 and 6).
``--synchronous NORMAL`` runs both on ``PRAGMA synchronous=NORMAL`` (safe from corruption in
WAL mode; a commit does not wait for an fsync) instead of SQLite's default ``FULL``;
``--conn-max-age 0`` runs both on Django's default ``CONN_MAX_AGE`` (``db_worker`` then
reconnects per task; the worker keeps its connection).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlite_bench  # beside this script: on sys.path when it runs

ROOT = sqlite_bench.ROOT


#: the goals of issue 23 (ratios spanner_queues / django-tasks-db at defaults)
DRAIN_GOAL, ENQUEUE_GOAL = 5.0, 1.0


def setup(workdir: Path) -> None:
    sqlite_bench.setup(workdir, "benchmarks.tasks_settings")


def backend_settings() -> dict[str, str]:
    """What each backend's database connection runs with, read back from SQLite."""
    from django.db import connections

    from spanner_queues.contrib.tasks.models import TaskMessage
    from spanner_queues.engines import engine_for

    out = {}
    for name, alias in (
        ("spanner_queues", engine_for(TaskMessage).database),
        ("django_tasks_db", "default"),  # (DatabaseBackend: the model's default database)
    ):
        conn = connections[alias]
        if conn.vendor != "sqlite":  # (a benchmark may name vendors: SQ_BENCH_BACKEND)
            out[name] = f"database {alias!r}: {conn.vendor}"
            continue
        with conn.cursor() as cursor:
            journal = cursor.execute("PRAGMA journal_mode").fetchone()[0]
            sync = cursor.execute("PRAGMA synchronous").fetchone()[0]
        sync_name = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(sync, str(sync))
        mode = conn.settings_dict["OPTIONS"].get("transaction_mode", "DEFERRED")
        out[name] = (
            f"database {alias!r}: journal_mode={journal} synchronous={sync_name} "
            f"transaction_mode={mode} CONN_MAX_AGE={conn.settings_dict['CONN_MAX_AGE']}"
        )
    return out


def clear() -> None:
    sqlite_bench.clear(
        "workerbench.Order",
        "spanner_queues_tasks.TaskMessage",
        "spanner_queues_tasks.TaskResultRecord",
    )


def bench_enqueue(n: int) -> dict[str, Any]:
    from django.db import transaction

    from benchmarks.workerbench.models import Order
    from benchmarks.workerbench.tasks import noop

    ours_task = noop.using(backend="queues")
    theirs_task = noop.using(backend="default")

    def ours(i: int) -> None:
        with transaction.atomic():
            order = Order.objects.create(n=i)
            ours_task.enqueue(str(order.pk))

    def theirs(i: int) -> None:
        with transaction.atomic():
            order = Order.objects.create(n=i)
            theirs_task.enqueue(str(order.pk))

    times: dict[str, list[float]] = {"spanner_queues": [], "django_tasks_db": []}
    for i in range(50):  # warm-up
        ours(i)
        theirs(i)
    clear()
    for r in range(max(1, n // 100)):
        for name, fn in (("spanner_queues", ours), ("django_tasks_db", theirs)):
            for i in range(100):
                t0 = time.perf_counter()
                fn(r * 100 + i)
                times[name].append(time.perf_counter() - t0)
    clear()
    return {
        name: {
            "ops_per_s": len(ts) / sum(ts),
            "p50_ms": statistics.median(ts) * 1000,
            "p99_ms": statistics.quantiles(ts, n=100)[98] * 1000,
            "n": len(ts),
        }
        for name, ts in times.items()
    }


def bench_drain(
    n: int, concurrency: list[int], prefetch: list[int], rounds: int = 3
) -> dict[str, Any]:
    """Each round drains a backlog of ``n`` with every variant of ours, then with
    ``db_worker``: the figures are totals over the rounds (tasks / seconds), so that a change of
    the machine's load during the run falls on both backends alike."""
    from django.core.management import call_command
    from django.db import transaction
    from django_tasks_db.models import DBTaskResult

    from benchmarks.workerbench.tasks import noop
    from spanner_queues.contrib.tasks.models import TaskMessage, TaskResultRecord
    from spanner_queues.worker import Worker

    ours_task = noop.using(backend="queues")
    # None: the worker's default (adaptive prefetch); then each fixed prefetch asked for
    variants: list[tuple[int, int | None]] = [(c, None) for c in concurrency] + [
        (c, p) for c in concurrency for p in prefetch
    ]
    seconds: dict[str, list[float]] = {}
    for _round in range(rounds):
        for c, p in variants:
            with transaction.atomic():
                for i in range(n):
                    ours_task.enqueue(str(i))
            t0 = time.perf_counter()
            stats = Worker(
                ["spanner_queues_tasks.TaskMessage"],
                burst=True,
                concurrency=c,
                prefetch=p,
                install_signal_handlers=False,
            ).run()
            elapsed = time.perf_counter() - t0
            done = TaskResultRecord.objects.filter(status="SUCCESSFUL").count()
            assert stats.processed == n and done == n and not TaskMessage.objects.exists(), stats
            name = f"spanner_queues (concurrency {c}" + (f", prefetch {p})" if p else ")")
            seconds.setdefault(name, []).append(elapsed)
            clear()

        with transaction.atomic():
            for i in range(n):
                noop.enqueue(str(i))
        t0 = time.perf_counter()
        call_command("db_worker", batch=True, startup_delay=False, reload=False, verbosity=0)
        elapsed = time.perf_counter() - t0
        done = DBTaskResult.objects.filter(status="SUCCESSFUL").count()
        assert done == n, f"db_worker finished {done} of {n}"
        seconds.setdefault("django_tasks_db", []).append(elapsed)
        clear()
    return {
        name: {
            "tasks_per_s": n * len(ts) / sum(ts),
            "n": n * len(ts),
            "rounds_tasks_per_s": [round(n / t) for t in ts],
        }
        for name, ts in seconds.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--enqueue", type=int, default=2000, help="transactions in (a)")
    parser.add_argument("--drain", type=int, default=2000, help="backlog in (b)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds of (b), ours then theirs"
    )
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 4], help="worker threads in (b)"
    )
    parser.add_argument(
        "--prefetch", type=int, nargs="*", default=[10], help="prefetch variants in (b)"
    )
    parser.add_argument(
        "--synchronous",
        choices=["FULL", "NORMAL"],
        default=None,
        help="PRAGMA synchronous for both backends (default: $SQ_BENCH_SYNCHRONOUS, else FULL)",
    )
    parser.add_argument(
        "--conn-max-age",
        choices=["none", "0"],
        default=None,
        help="CONN_MAX_AGE for both backends (default: $SQ_BENCH_CONN_MAX_AGE, else none: "
        "persistent; 0 is Django's default)",
    )
    parser.add_argument("--json", action="store_true", help="also print the raw figures")
    args = parser.parse_args()
    if args.synchronous:
        os.environ["SQ_BENCH_SYNCHRONOUS"] = args.synchronous
    if args.conn_max_age:
        os.environ["SQ_BENCH_CONN_MAX_AGE"] = args.conn_max_age

    with tempfile.TemporaryDirectory(prefix="sq-tasks-bench-") as tmp:
        setup(Path(tmp))
        import importlib.metadata

        import django

        framework = (
            "django.tasks"
            if django.VERSION >= (6,)
            else f"django-tasks {importlib.metadata.version('django-tasks')}"
        )
        print(
            f"# Tasks API: spanner_queues QueueBackend vs django-tasks-db "
            f"{importlib.metadata.version('django-tasks-db')} ({framework}): "
            f"Python {platform.python_version()}, "
            f"Django {django.get_version()}, "
            + (
                "PostgreSQL, "
                if os.environ.get("SQ_BENCH_POSTGRES")
                else "SQLite (WAL, IMMEDIATE), "
            )
            + f"{os.cpu_count()} CPUs, "
            f"load {os.getloadavg()[0]:.1f}"
        )
        ran = backend_settings()
        for name, text in ran.items():
            print(f"  {name:<16} {text}")
        enqueue = bench_enqueue(args.enqueue)
        drain = bench_drain(
            args.drain, args.concurrency, [p for p in args.prefetch if p >= 1], args.rounds
        )
        print(f"load after {os.getloadavg()[0]:.1f}")

    print(f"\n(a) enqueue: {args.enqueue} transactions of one ORM insert + one task")
    for name, r in enqueue.items():
        print(
            f"  {name:<36} {r['ops_per_s']:8.0f} txn/s  "
            f"p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms"
        )
    ratio = enqueue["spanner_queues"]["ops_per_s"] / enqueue["django_tasks_db"]["ops_per_s"]
    print(
        f"  {'ratio (throughput)':<36} {ratio:.2f}x  (goal >= {ENQUEUE_GOAL:.1f}x: "
        f"{'met' if ratio >= ENQUEUE_GOAL else 'not met'})"
    )

    print(f"\n(b) drain a backlog of {args.drain} no-op tasks, {args.rounds} alternating rounds")
    base = drain["django_tasks_db"]["tasks_per_s"]
    for name, r in drain.items():
        ratio = "" if name == "django_tasks_db" else f"  ratio {r['tasks_per_s'] / base:.2f}x"
        rounds = "/".join(str(x) for x in r["rounds_tasks_per_s"])
        print(f"  {name:<36} {r['tasks_per_s']:8.0f} tasks/s{ratio}  (rounds: {rounds})")
    # the worker's defaults: concurrency 1, adaptive prefetch (the first variant run)
    default_name = next(iter(drain))
    ratio_d = drain[default_name]["tasks_per_s"] / base
    verdict = "met" if ratio_d >= DRAIN_GOAL else "not met"
    print(f"  ratio, {default_name}: {ratio_d:.2f}x  (goal >= {DRAIN_GOAL:.0f}x: {verdict})")
    if args.json:
        print(json.dumps({"settings": ran, "enqueue": enqueue, "drain": drain}, indent=2))


if __name__ == "__main__":
    main()

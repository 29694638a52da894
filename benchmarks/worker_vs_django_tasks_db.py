"""spanner_queues' worker against django-tasks-db (``DatabaseBackend`` + ``db_worker``).

    .venv/bin/python benchmarks/worker_vs_django_tasks_db.py
    .venv/bin/python benchmarks/worker_vs_django_tasks_db.py --enqueue 2000 --drain 5000 \\
        --rate 20 --seconds 10 --json

One machine, one run, one fresh SQLite file (WAL, ``transaction_mode="IMMEDIATE"``, persistent
connections) shared by both, ``benchmarks/worker_settings.py``:

(a) enqueue: N transactions, each ``with atomic(): Order.objects.create(...)`` plus one message
    (``OrderTasks.send(...)``) or one task (``noop.enqueue(...)``); alternating rounds of 100.
(b) drain: a backlog of N messages / tasks processed by a no-op receiver / task, in-process:
    ``Worker(burst=True)`` (each message acked in its own transaction, the receiver's) against
    ``db_worker --batch --no-startup-delay``; the same with ``prefetch`` (one claim transaction
    for up to concurrency x prefetch messages, each still acked in its own transaction); and,
    for reference (not a per-message ack), a batch
    receiver acking up to 100 messages per transaction.
(b'') the drain at the defaults in alternating pairs (ours, then theirs, in-process and as the
    commands), ``--pairs`` rounds of ``--pairs-drain`` messages: the medians of the ratios
    (issue 41's goal), so both sides of a ratio meet the same machine.
(c) latency from commit to receiver start, p50/p99, at a fixed offered rate, each worker a child
    process at its default settings (``runqueueworker``; ``db_worker``, whose default interval
    is 1 s).

Prints the figures and the ratios (spanner_queues / django-tasks-db, higher is better for
throughput, lower for latency).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlite_bench  # beside this script: on sys.path when it runs

ROOT = sqlite_bench.ROOT


def setup(workdir: Path) -> None:
    sqlite_bench.setup(workdir, "benchmarks.worker_settings")


def clear() -> None:
    sqlite_bench.clear("workerbench.Order", "workerbench.OrderTasks", "workerbench.OrderBatches")


# --- (a) enqueue -----------------------------------------------------------------------------
def bench_enqueue(n: int) -> dict[str, Any]:
    from django.db import transaction

    from benchmarks.workerbench.models import Order, OrderTasks
    from benchmarks.workerbench.tasks import noop

    def ours(i: int) -> None:
        with transaction.atomic():
            order = Order.objects.create(n=i)
            OrderTasks.send(payload={"order": order.pk})

    def theirs(i: int) -> None:
        with transaction.atomic():
            order = Order.objects.create(n=i)
            noop.enqueue(str(order.pk))

    times: dict[str, list[float]] = {"spanner_queues": [], "django_tasks_db": []}
    for i in range(50):  # warm-up
        ours(i)
        theirs(i)
    clear()
    rounds = max(1, n // 100)
    for r in range(rounds):
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


# --- (b) drain -------------------------------------------------------------------------------
def bench_drain(n: int, concurrency: list[int], prefetch: list[int]) -> dict[str, Any]:
    from django.core.management import call_command
    from django.db import transaction
    from django_tasks_db.models import DBTaskResult

    from benchmarks.workerbench.models import OrderBatches, OrderTasks
    from benchmarks.workerbench.tasks import noop
    from spanner_queues.worker import Worker

    results: dict[str, Any] = {}
    # the adaptive prefetch (the default) where this version of the worker has it
    adaptive = inspect.signature(Worker).parameters["prefetch"].default is None
    variants: list[tuple[int, int | None]] = [(c, None) for c in concurrency if adaptive]
    variants += [(c, 1) for c in concurrency] + [(c, p) for c in concurrency for p in prefetch]
    for c, p in variants:
        for start in range(0, n, 500):
            OrderTasks.send_many([{"payload": ""} for _ in range(min(500, n - start))])
        t0 = time.perf_counter()
        stats = Worker(
            ["workerbench.OrderTasks"],
            burst=True,
            concurrency=c,
            prefetch=p,
            install_signal_handlers=False,
        ).run()
        elapsed = time.perf_counter() - t0
        assert stats.processed == n and not OrderTasks.objects.exists(), stats
        name = f"spanner_queues (concurrency {c}, " + (
            "adaptive prefetch)" if p is None else f"prefetch {p})"
        )
        results[name] = {"msg_per_s": n / elapsed, "n": n}

    # Not a per-message ack: a batch receiver acks each batch of up to 100 in one transaction.
    for start in range(0, n, 500):
        OrderBatches.send_many([{"payload": ""} for _ in range(min(500, n - start))])
    t0 = time.perf_counter()
    stats = Worker(["workerbench.OrderBatches"], burst=True, install_signal_handlers=False).run()
    elapsed = time.perf_counter() - t0
    assert stats.processed == n and not OrderBatches.objects.exists(), stats
    results["spanner_queues (batch receiver, 100/ack)"] = {"msg_per_s": n / elapsed, "n": n}

    with transaction.atomic():
        for i in range(n):
            noop.enqueue(str(i))
    t0 = time.perf_counter()
    call_command("db_worker", batch=True, startup_delay=False, reload=False, verbosity=0)
    elapsed = time.perf_counter() - t0
    done = DBTaskResult.objects.filter(status="SUCCESSFUL").count()
    assert done == n, f"db_worker finished {done} of {n}"
    results["django_tasks_db"] = {"msg_per_s": n / elapsed, "n": n}
    clear()
    return results


def bench_pairs(n: int, rounds: int, workdir: Path) -> dict[str, Any]:
    """(b'') The drain at the defaults in alternating pairs, so that both sides of each ratio
    meet the same machine (a shared machine's load moves single figures by 2x): per round,
    ``Worker(burst=True)`` in-process then ``db_worker --batch`` in-process, then
    ``runqueueworker --burst`` then ``db_worker --batch --interval 0`` as child processes
    (process start included), each on a fresh backlog of ``n``. The medians of the rounds'
    ratios."""
    from django.core.management import call_command
    from django.db import connections, transaction
    from django_tasks_db.models import DBTaskResult

    from benchmarks.workerbench.models import OrderTasks
    from benchmarks.workerbench.tasks import noop
    from spanner_queues.worker import Worker

    def backlog(ours: bool) -> None:
        if ours:
            for start in range(0, n, 500):
                OrderTasks.send_many([{"payload": ""} for _ in range(min(500, n - start))])
        else:
            with transaction.atomic():
                for i in range(n):
                    noop.enqueue(str(i))
        connections.close_all()

    def theirs_done() -> None:
        done = DBTaskResult.objects.filter(status="SUCCESSFUL").count()
        assert done == n, f"db_worker finished {done} of {n}"
        clear()

    in_process: list[tuple[float, float]] = []
    commands: list[tuple[float, float]] = []
    for _ in range(rounds):
        backlog(True)
        t0 = time.perf_counter()
        stats = Worker(["workerbench.OrderTasks"], burst=True, install_signal_handlers=False).run()
        ours = n / (time.perf_counter() - t0)
        assert stats.processed == n, stats
        backlog(False)
        t0 = time.perf_counter()
        call_command("db_worker", batch=True, startup_delay=False, reload=False, verbosity=0)
        theirs = n / (time.perf_counter() - t0)
        theirs_done()
        in_process.append((ours, theirs))

        backlog(True)
        args = ["runqueueworker", "workerbench.OrderTasks", "--burst", "-v0"]
        ours = n / _timed_command(args, workdir, "cmd")
        assert not OrderTasks.objects.exists()
        backlog(False)
        args = ["db_worker", "--batch", "--interval", "0", "--no-startup-delay", "-v0"]
        theirs = n / _timed_command(args, workdir, "db_worker")
        theirs_done()
        commands.append((ours, theirs))
    return {
        "in_process": in_process,
        "commands": commands,
        "in_process_ratio": statistics.median(a / b for a, b in in_process),
        "commands_ratio": statistics.median(a / b for a, b in commands),
    }


# --- (b') drain by the commands, process start included ---------------------------------
def _timed_command(args: list[str], workdir: Path, name: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("SQ_BENCH_TRACE", None)
    with open(workdir / f"{name}.log", "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "django", *args], env=env, cwd=ROOT, stdout=out, stderr=out
        )
        elapsed = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: see {name}.log")
    return elapsed


def bench_commands(n: int, workdir: Path) -> dict[str, Any]:
    """``runqueueworker --burst`` with no tuning flags (a no-op receiver, then a batch
    receiver) against ``db_worker --batch --interval 0``, each a child process timed from its
    start to its exit."""
    from django.db import connections, transaction
    from django_tasks_db.models import DBTaskResult

    from benchmarks.workerbench.models import OrderBatches, OrderTasks
    from benchmarks.workerbench.tasks import noop

    results: dict[str, Any] = {}
    runs = [
        ("runqueueworker --burst", OrderTasks, "workerbench.OrderTasks"),
        ("runqueueworker --burst (batch receiver)", OrderBatches, "workerbench.OrderBatches"),
    ]
    for name, model, label in runs:
        for start in range(0, n, 500):
            model.send_many([{"payload": ""} for _ in range(min(500, n - start))])
        connections.close_all()
        elapsed = _timed_command(["runqueueworker", label, "--burst", "-v0"], workdir, "cmd")
        left = model.objects.count()
        assert left == 0, f"{name} left {left} messages"
        results[name] = {"msg_per_s": n / elapsed, "n": n, "seconds": elapsed}

    with transaction.atomic():
        for i in range(n):
            noop.enqueue(str(i))
    connections.close_all()
    args = ["db_worker", "--batch", "--interval", "0", "--no-startup-delay", "-v0"]
    elapsed = _timed_command(args, workdir, "db_worker")
    done = DBTaskResult.objects.filter(status="SUCCESSFUL").count()
    assert done == n, f"db_worker finished {done} of {n}"
    results["db_worker --batch --interval 0"] = {"msg_per_s": n / elapsed, "n": n}
    clear()
    return results


def bench_bare_sqlite(n: int, workdir: Path) -> dict[str, Any]:
    """The floor of a per-message ack: Python's sqlite3, no Django, on a file with the same
    pragmas, ``BEGIN IMMEDIATE; DELETE one row; COMMIT`` per row."""
    import sqlite3

    synchronous = os.environ.get("SQ_BENCH_SYNCHRONOUS", "FULL")
    db = sqlite3.connect(workdir / "bare.sqlite3", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("CREATE TABLE bare (id INTEGER PRIMARY KEY, payload TEXT)")
    db.execute("BEGIN")
    db.executemany("INSERT INTO bare VALUES (?, '')", ((i,) for i in range(n)))
    db.execute("COMMIT")
    t0 = time.perf_counter()
    for i in range(n):
        db.execute("BEGIN IMMEDIATE")
        db.execute("DELETE FROM bare WHERE id = ?", (i,))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    db.close()
    return {"txn_per_s": n / elapsed, "n": n}


# --- (c) latency -----------------------------------------------------------------------------
def _child(args: list[str], trace: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, SQ_BENCH_TRACE=str(trace), PYTHONPATH=str(ROOT))
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "django", *args], env=env, cwd=ROOT, stdout=out, stderr=out
        )


def _traced(trace: Path) -> dict[str, float]:
    if not trace.exists():
        return {}
    starts = {}
    for line in trace.read_text().splitlines():
        key, at = line.split()
        starts.setdefault(key, float(at))
    return starts


def _wait_for(keys: set[str], trace: Path, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not keys <= _traced(trace).keys():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"worker exited or timed out ({proc.returncode})")
        time.sleep(0.05)


def bench_latency(rate: float, seconds: float, workdir: Path) -> dict[str, Any]:
    from django.db import transaction

    from benchmarks.workerbench.models import Order, OrderTasks
    from benchmarks.workerbench.tasks import noop

    def send_ours(key: str) -> None:
        with transaction.atomic():
            Order.objects.create(n=0)
            OrderTasks.send(id=key)

    def send_theirs(key: str) -> None:
        with transaction.atomic():
            Order.objects.create(n=0)
            noop.enqueue(key)

    variants = {
        "spanner_queues": (["runqueueworker", "workerbench.OrderTasks", "-v0"], send_ours),
        "django_tasks_db": (["db_worker", "-v0"], send_theirs),
    }
    results: dict[str, Any] = {}
    count = max(1, int(rate * seconds))
    for name, (args, send) in variants.items():
        trace = workdir / f"{name}.trace"
        proc = _child(args, trace, workdir / f"{name}.log")
        try:
            send(f"{name}-warmup")
            _wait_for({f"{name}-warmup"}, trace, proc, 60)
            committed: dict[str, float] = {}
            t_start = time.perf_counter()
            for i in range(count):  # a fixed schedule: one commit every 1/rate seconds
                due = t_start + i / rate
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                key = f"{name}-{i}"
                send(key)
                committed[key] = time.time()
            _wait_for(set(committed), trace, proc, 120)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        starts = _traced(trace)
        latencies = sorted((starts[k] - committed[k]) * 1000 for k in committed)
        results[name] = {
            "p50_ms": statistics.median(latencies),
            "p99_ms": statistics.quantiles(latencies, n=100)[98],
            "n": len(latencies),
        }
        clear()
    return results


def goal(label: str, measured: str, target: str, met: bool) -> None:
    print(f"  {label:<58} {measured:>14}  target {target:<8} {'met' if met else 'NOT MET'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--enqueue", type=int, default=2000, help="transactions in (a)")
    parser.add_argument("--drain", type=int, default=5000, help="backlog in (b)")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 4], help="worker threads in (b)"
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        nargs="*",
        default=[10, 100],
        help="fixed prefetch variants in (b), at each concurrency (each message still acked "
        "alone); the adaptive default and prefetch 1 always run",
    )
    parser.add_argument("--rate", type=float, default=20.0, help="messages per second in (c)")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of (c)")
    parser.add_argument(
        "--synchronous",
        choices=["FULL", "NORMAL"],
        default=os.environ.get("SQ_BENCH_SYNCHRONOUS", "NORMAL"),
        help="PRAGMA synchronous for both (default: NORMAL, as issue 14's goals)",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=3,
        help="rounds of the alternating drain at the defaults (b''), ours then theirs",
    )
    parser.add_argument(
        "--pairs-drain", type=int, default=10000, help="the backlog of each drain in (b'')"
    )
    parser.add_argument("--json", action="store_true", help="also print the raw figures")
    args = parser.parse_args()
    os.environ["SQ_BENCH_SYNCHRONOUS"] = args.synchronous
    command = (
        ".venv/bin/python benchmarks/worker_vs_django_tasks_db.py "
        f"--synchronous {args.synchronous} --enqueue {args.enqueue} --drain {args.drain} "
        f"--rate {args.rate:g} --seconds {args.seconds:g}"
    )

    with tempfile.TemporaryDirectory(prefix="sq-worker-bench-") as tmp:
        workdir = Path(tmp)
        setup(workdir)
        import django
        import django_tasks_db

        print(
            f"# worker vs django-tasks-db {getattr(django_tasks_db, '__version__', '0.13')}: "
            f"Python {platform.python_version()}, Django {django.get_version()}, "
            + (
                f"PostgreSQL ({os.environ['SQ_BENCH_POSTGRES']}, fsync on), "
                if os.environ.get("SQ_BENCH_POSTGRES")
                else f"SQLite (WAL, IMMEDIATE, synchronous={args.synchronous}), "
            )
            + f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
        )
        enqueue = bench_enqueue(args.enqueue)
        bare = bench_bare_sqlite(args.drain, workdir)
        commands = bench_commands(args.drain, workdir)
        drain = bench_drain(args.drain, args.concurrency, [p for p in args.prefetch if p > 1])
        latency = bench_latency(args.rate, args.seconds, workdir)
        pairs = bench_pairs(args.pairs_drain, args.pairs, workdir) if args.pairs else None
        print(f"load after {os.getloadavg()[0]:.1f}")

    ours, theirs = enqueue["spanner_queues"], enqueue["django_tasks_db"]
    print(f"\n(a) enqueue: {args.enqueue} transactions of one ORM insert + one message/task")
    for name, r in enqueue.items():
        print(
            f"  {name:<42} {r['ops_per_s']:8.0f} txn/s  "
            f"p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms"
        )
    ratio = ours["ops_per_s"] / theirs["ops_per_s"]
    print(f"  {'ratio (throughput)':<42} {ratio:.2f}x")

    print(f"\n(b) drain a backlog of {args.drain}, the commands, process start included")
    base = commands["db_worker --batch --interval 0"]["msg_per_s"]
    for name, r in commands.items():
        ratio = "" if name.startswith("db_worker") else f"  ratio {r['msg_per_s'] / base:.1f}x"
        print(f"  {name:<42} {r['msg_per_s']:8.0f} msg/s{ratio}")
    print(f"  {'bare sqlite3 BEGIN IMMEDIATE/DELETE/COMMIT':<42} {bare['txn_per_s']:8.0f} txn/s")

    print(f"\n(b) drain a backlog of {args.drain} in-process (Worker(burst=True), db_worker)")
    in_base = drain["django_tasks_db"]["msg_per_s"]
    for name, r in drain.items():
        ratio = "" if name == "django_tasks_db" else f"  ratio {r['msg_per_s'] / in_base:.1f}x"
        print(f"  {name:<42} {r['msg_per_s']:8.0f} msg/s{ratio}")

    print(
        f"\n(c) commit -> receiver start at {args.rate:g}/s for {args.seconds:g} s "
        "(default settings)"
    )
    for name, r in latency.items():
        print(f"  {name:<42} p50 {r['p50_ms']:8.1f} ms  p99 {r['p99_ms']:8.1f} ms")
    lat_ours, lat_theirs = latency["spanner_queues"], latency["django_tasks_db"]
    print(
        f"  {'ratio (ours / theirs)':<42} p50 {lat_ours['p50_ms'] / lat_theirs['p50_ms']:.3f}  "
        f"(1/{lat_theirs['p50_ms'] / lat_ours['p50_ms']:.0f})  "
        f"p99 {lat_ours['p99_ms'] / lat_theirs['p99_ms']:.3f}"
    )

    if pairs:
        print(
            f"\n(b'') drain a backlog of {args.pairs_drain} at the defaults, alternating pairs "
            f"(ours, then theirs), {args.pairs} rounds"
        )
        for label, key in (("in-process", "in_process"), ("commands", "commands")):
            for i, (ours_r, theirs_r) in enumerate(pairs[key], 1):
                print(
                    f"  {label + ' round ' + str(i):<42} {ours_r:8.0f} / {theirs_r:5.0f} msg/s  "
                    f"ratio {ours_r / theirs_r:.1f}x"
                )
        print(
            f"\nIssue 41's goal (reproduce: {command} --pairs {args.pairs}"
            f" --pairs-drain {args.pairs_drain})"
        )
        # issue 41: SQLite >= 20x; PostgreSQL >= 5x (and procrastinate: worker_vs_procrastinate)
        db, target = ("PostgreSQL", 5) if os.environ.get("SQ_BENCH_POSTGRES") else ("SQLite", 20)
        r = pairs["in_process_ratio"]
        goal(f"{db} drain, defaults, in-process: median", f"{r:.1f}x", f">= {target}x", r >= target)
        r = pairs["commands_ratio"]
        goal(f"{db} drain, the commands: median", f"{r:.1f}x", f">= {target}x", r >= target)

    print(f"\nIssue 14's goals (reproduce: {command})")
    defaults = commands["runqueueworker --burst"]["msg_per_s"]
    batch = commands["runqueueworker --burst (batch receiver)"]["msg_per_s"]
    r = defaults / base
    goal("Defaults: runqueueworker --burst / db_worker", f"{r:.1f}x", ">= 10x", r >= 10)
    # the drain itself (no process start): Worker(burst=True) at its defaults, concurrency 1
    per_message = next(v for k, v in drain.items() if "concurrency 1, adaptive" in k)
    r = per_message["msg_per_s"] / bare["txn_per_s"]
    goal(
        f"Per-message ack: Worker defaults / bare loop ({bare['txn_per_s']:.0f}/s)",
        f"{r:.0%}",
        ">= 25%",
        r >= 0.25,
    )
    r = batch / base
    goal("Batch receivers: runqueueworker --burst / db_worker", f"{r:.1f}x", ">= 50x", r >= 50)
    r = lat_theirs["p50_ms"] / lat_ours["p50_ms"]
    goal("Latency: commit-to-start p50, db_worker / ours", f"1/{r:.0f}", "<= 1/20", r >= 20)
    if args.json:
        print(
            json.dumps(
                {
                    "enqueue": enqueue,
                    "commands": commands,
                    "bare_sqlite": bare,
                    "drain": drain,
                    "latency": latency,
                    "pairs": pairs,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()

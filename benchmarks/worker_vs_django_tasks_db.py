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
(c) latency from commit to receiver start, p50/p99, at a fixed offered rate, each worker a child
    process at its default settings (``runqueueworker``; ``db_worker``, whose default interval
    is 1 s).

Prints the figures and the ratios (spanner_queues / django-tasks-db, higher is better for
throughput, lower for latency).
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parent.parent


def setup(workdir: Path) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.worker_settings"
    os.environ["SQ_BENCH_SQLITE_PATH"] = str(workdir / "bench.sqlite3")
    os.environ.pop("SQ_BENCH_TRACE", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)


def clear() -> None:
    from django_tasks_db.models import DBTaskResult

    from benchmarks.workerbench.models import Order, OrderBatches, OrderTasks

    Order.objects.all().delete()
    OrderTasks.objects.all().delete()
    OrderBatches.objects.all().delete()
    DBTaskResult.objects.all().delete()


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
    variants = [(c, 1) for c in concurrency] + [(c, p) for c in concurrency for p in prefetch]
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
        name = f"spanner_queues (concurrency {c}" + (f", prefetch {p})" if p > 1 else ")")
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
        help="prefetch variants in (b), at each concurrency (each message still acked alone)",
    )
    parser.add_argument("--rate", type=float, default=20.0, help="messages per second in (c)")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of (c)")
    parser.add_argument("--json", action="store_true", help="also print the raw figures")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sq-worker-bench-") as tmp:
        workdir = Path(tmp)
        setup(workdir)
        import django
        import django_tasks_db

        print(
            f"# worker vs django-tasks-db {getattr(django_tasks_db, '__version__', '0.13')}: "
            f"Python {platform.python_version()}, Django {django.get_version()}, "
            f"SQLite (WAL, IMMEDIATE), {os.cpu_count()} CPUs, "
            f"load {os.getloadavg()[0]:.1f}"
        )
        enqueue = bench_enqueue(args.enqueue)
        drain = bench_drain(args.drain, args.concurrency, [p for p in args.prefetch if p > 1])
        latency = bench_latency(args.rate, args.seconds, workdir)
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

    print(f"\n(b) drain a backlog of {args.drain} with a no-op receiver/task")
    base = drain["django_tasks_db"]["msg_per_s"]
    for name, r in drain.items():
        ratio = "" if name == "django_tasks_db" else f"  ratio {r['msg_per_s'] / base:.1f}x"
        print(f"  {name:<42} {r['msg_per_s']:8.0f} msg/s{ratio}")

    print(
        f"\n(c) commit -> receiver start at {args.rate:g}/s for {args.seconds:g} s "
        "(default settings)"
    )
    for name, r in latency.items():
        print(f"  {name:<42} p50 {r['p50_ms']:8.1f} ms  p99 {r['p99_ms']:8.1f} ms")
    ours, theirs = latency["spanner_queues"], latency["django_tasks_db"]
    print(
        f"  {'ratio (ours / theirs)':<42} p50 {ours['p50_ms'] / theirs['p50_ms']:.3f}  "
        f"(1/{theirs['p50_ms'] / ours['p50_ms']:.0f})  "
        f"p99 {ours['p99_ms'] / theirs['p99_ms']:.3f}"
    )
    if args.json:
        print(json.dumps({"enqueue": enqueue, "drain": drain, "latency": latency}, indent=2))


if __name__ == "__main__":
    main()

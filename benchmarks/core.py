"""Core benchmark: the cost of ``send`` next to an ORM insert, and claim+ack throughput.

    .venv/bin/python benchmarks/core.py                 # SQLite, then a fresh Spanner emulator
    .venv/bin/python benchmarks/core.py --sqlite-only
    .venv/bin/python benchmarks/core.py --seconds 5     # longer measurements (default 2 s each)

Each backend runs in a child process of its own, on a fresh database: a new SQLite file (WAL,
``transaction_mode="IMMEDIATE"``) in a temporary directory, or a private ``emulator_main``
started on a free loopback port for this run (``SPANNER_EMULATOR_HOST`` is ignored) with a new
database. Both use ``benchmarks/settings.py`` and the models of ``tests.testapp``.

Measured, single-threaded:

- ``insert``: ``with atomic(): Account.objects.create(...)``;
- ``insert + send``: the same block plus ``UserTasks.send(user_id=..., message_id=...,
  payload={...})``. The variants run in alternating rounds so that drift (the emulator slows
  down as it ages) hits all alike; the ratio of their medians is the cost of ``send``;
- ``insert + raw INSERT``: the same block plus the same queue row written by hand-written SQL
  with its parameters prepared beforehand: the bound, what one more row costs the database;
- claim+ack throughput from a queue (``Jobs``) pre-filled with ``--depth`` messages:
  ``receive(max_messages=1)`` then ``ack`` in its own ``atomic()``; ``receive(max_messages=10)``
  then one ``atomic()`` + ``ack`` per message; ``receive(max_messages=10)`` then one ``atomic()``
  + ``ack_many``. Each stops after ``--seconds`` or when the queue is empty.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = {
    "sqlite": "SQLite (WAL, IMMEDIATE)",
    "emulator": "Spanner emulator",
}
#: default queue depth before each claim+ack measurement, per backend. The emulator scans whole
#: tables, so its depth is kept small (and stated in the output).
DEPTH = {"sqlite": 10_000, "emulator": 300}
#: issue 14: ``send()`` adds at most 30% to the ORM insert it rides with (ratio of p50s, SQLite)
SEND_GOAL = 1.30


# --- child: one backend ---------------------------------------------------------------------


def _setup(backend: str, workdir: str) -> dict[str, str]:
    """Point the settings at a fresh database, set Django up and migrate."""
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["SQ_BENCH_DATABASE"] = backend
    info: dict[str, str] = {}
    if backend == "sqlite":
        os.environ["SQ_BENCH_SQLITE_PATH"] = str(Path(workdir) / "bench.sqlite3")
        import sqlite3

        info["database"] = f"SQLite {sqlite3.sqlite_version}"
    else:
        from spanner_queues_emulator import ensure_database, ensure_emulator

        os.environ.pop("SPANNER_EMULATOR_HOST", None)  # always a fresh private emulator
        instance, database = "sq-bench", f"sqbench{os.getpid()}"
        os.environ["SQ_BENCH_SPANNER_INSTANCE"] = instance
        os.environ["SQ_BENCH_SPANNER_DATABASE"] = database
        info["emulator_host"] = ensure_emulator(instance)
        ensure_database(instance, database)
        info["database"] = "emulator_main " + _emulator_version()

    import django

    django.setup()
    from django.core.management import call_command

    started = time.perf_counter()
    call_command("migrate", verbosity=0)
    info["migrate_seconds"] = f"{time.perf_counter() - started:.2f}"
    info["django"] = django.get_version()
    return info


def _emulator_version() -> str:
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "google-cloud-cli-spanner-emulator"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        out = ""
    return f"(google-cloud-cli-spanner-emulator {out})" if out else ""


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(samples),
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "mean_ms": statistics.fmean(ordered) * 1000,
    }


def _send_vs_insert(seconds: float) -> dict[str, Any]:
    from django.db import transaction

    from tests.testapp.models import Account, UserTasks

    counter = iter(range(10**9))

    def insert() -> None:
        with transaction.atomic():
            Account.objects.create(name="ada")

    def insert_send() -> None:
        with transaction.atomic():
            account = Account.objects.create(name="ada")
            UserTasks.send(
                user_id=account.pk,
                message_id=f"welcome-{next(counter)}",
                payload={"type": "welcome", "user_id": account.pk},
            )

    insert_row = _raw_insert(UserTasks)

    def insert_raw() -> None:  # the bound: the same row, SQL and parameters prepared beforehand
        with transaction.atomic():
            account = Account.objects.create(name="ada")
            insert_row(account.pk, f"raw-{next(counter)}")

    variants: dict[str, Callable[[], None]] = {
        "insert": insert,
        "insert_send": insert_send,
        "insert_raw": insert_raw,
    }
    for fn in variants.values():  # warm up connections, statement caches, the emulator session
        for _ in range(10):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in variants}
    deadline = time.perf_counter() + 2 * seconds
    while time.perf_counter() < deadline:
        for name, fn in variants.items():  # alternating rounds of 10
            for _ in range(10):
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
    result: dict[str, Any] = {name: _ms(s) for name, s in samples.items()}
    ins, both = result["insert"], result["insert_send"]
    result["ratio_p50"] = both["p50_ms"] / ins["p50_ms"]
    result["ratio_mean"] = both["mean_ms"] / ins["mean_ms"]
    result["raw_ratio_p50"] = result["insert_raw"]["p50_ms"] / ins["p50_ms"]
    return result


def _raw_insert(model: Any) -> Callable[[Any, str], None]:
    """One queue row written with hand-written SQL through Django's cursor, every parameter
    but the key prepared once: what one more row costs the database, without ``send``."""
    from django.db import connection
    from django.db.models import BinaryField
    from django.utils import timezone

    now = timezone.now()
    fields = list(model._meta.local_concrete_fields)
    values = {
        "payload": b'{"type":"welcome","user_id":1}',
        "deliver_time": now,
        "send_time": now,
        "attempts": 0,
        "lease_token": None,
        "lease_expires_at": None,
    }
    prepared = {
        n: model._meta.get_field(n).get_db_prep_save(v, connection) for n, v in values.items()
    }
    quote = connection.ops.quote_name
    sql = "INSERT INTO {} ({}) VALUES ({})".format(
        quote(model._meta.db_table),
        ", ".join(quote(f.column) for f in fields),
        ", ".join(
            f.get_placeholder(b"", None, connection) if isinstance(f, BinaryField) else "%s"
            for f in fields
        ),
    )
    names = [f.attname for f in fields]

    def insert_row(user_id: Any, message_id: str) -> None:
        row = {**prepared, "user_id": user_id, "message_id": message_id}
        with connection.cursor() as cursor:
            cursor.execute(sql, [row[n] for n in names])

    return insert_row


def _fill(depth: int) -> None:
    from tests.testapp.models import Jobs

    Jobs.objects.all().delete()
    for start in range(0, depth, 500):
        Jobs.send_many([{"payload": {"n": n}} for n in range(start, min(start + 500, depth))])


def _claim_ack(mode: str, depth: int, seconds: float) -> dict[str, float]:
    from django.db import transaction

    from spanner_queues import api
    from tests.testapp.models import Jobs

    _fill(depth)
    batch = 1 if mode == "single" else 10
    receive_s: list[float] = []
    ack_s: list[float] = []
    done = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        messages = api.receive(Jobs, max_messages=batch)
        t1 = time.perf_counter()
        if not messages:
            break
        receive_s.append(t1 - t0)
        if mode == "ack_many":
            with transaction.atomic():
                api.ack_many(Jobs, messages)
            ack_s.append(time.perf_counter() - t1)
        else:
            for message in messages:
                t2 = time.perf_counter()
                with transaction.atomic():
                    api.ack(message)
                ack_s.append(time.perf_counter() - t2)
        done += len(messages)
    elapsed = time.perf_counter() - started
    return {
        "messages": done,
        "seconds": elapsed,
        "per_second": done / elapsed,
        "depth": depth,
        "receive": _ms(receive_s),
        "ack": _ms(ack_s),
    }


def child(backend: str, seconds: float, depth: int) -> None:
    with tempfile.TemporaryDirectory(prefix="sq-bench-") as workdir:
        info = _setup(backend, workdir)
        result: dict[str, Any] = {"backend": backend, "info": info}
        result["send"] = _send_vs_insert(seconds)
        for mode in ("single", "batch", "ack_many"):
            result[mode] = _claim_ack(mode, depth, seconds)
        from django.db import connections

        connections.close_all()
    print("RESULT " + json.dumps(result), flush=True)


# --- parent: run the children, print the table -----------------------------------------------


def run_child(backend: str, seconds: float, depth: int | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", backend, "--seconds", str(seconds)]
    cmd += ["--depth", str(depth or DEPTH[backend])]
    print(f"running {BACKENDS[backend]} ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"{backend} benchmark failed (exit {proc.returncode})")
    return json.loads(lines[-1][len("RESULT ") :])


def _nproc() -> int:
    """The CPUs this process may run on (what ``nproc`` prints)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def report(results: list[dict[str, Any]], seconds: float) -> str:
    names = [BACKENDS[r["backend"]] for r in results]
    width = max(24, *(len(n) for n in names)) + 2
    rows: list[tuple[str, list[str]]] = []

    def lat(key: str) -> list[str]:
        return ["{p50_ms:.2f} ms p50 ({n} runs)".format(**r["send"][key]) for r in results]

    rows.append(("atomic(): create()", lat("insert")))
    rows.append(("atomic(): create() + send()", lat("insert_send")))
    rows.append(("atomic(): create() + raw row", lat("insert_raw")))
    rows.append(
        (
            "send cost: ratio of p50s",
            [f"{r['send']['ratio_p50']:.2f}x" for r in results],
        )
    )
    rows.append(
        (
            "send cost: ratio of means",
            [f"{r['send']['ratio_mean']:.2f}x" for r in results],
        )
    )
    labels = {
        "single": "receive(1) + ack txn",
        "batch": "receive(10) + 10 ack txns",
        "ack_many": "receive(10) + ack_many txn",
    }
    for mode, label in labels.items():
        rows.append(
            (
                label,
                ["{per_second:.0f} msg/s ({messages} msgs)".format(**r[mode]) for r in results],
            )
        )
    rows.append(
        (
            "  receive(1) p50 / p99",
            ["{p50_ms:.2f} / {p99_ms:.2f} ms".format(**r["single"]["receive"]) for r in results],
        )
    )
    rows.append(
        (
            "  ack txn p50 / p99",
            ["{p50_ms:.2f} / {p99_ms:.2f} ms".format(**r["single"]["ack"]) for r in results],
        )
    )
    rows.append(
        (
            "  receive(10) p50 / p99",
            ["{p50_ms:.2f} / {p99_ms:.2f} ms".format(**r["batch"]["receive"]) for r in results],
        )
    )
    rows.append(("  queue depth at start", [str(r["single"]["depth"]) for r in results]))
    first = 30
    goals = [
        f"send cost {r['send']['ratio_p50']:.2f}x on {BACKENDS[r['backend']]} "
        + (
            f"(goal <= {SEND_GOAL:.2f}x: "
            f"{'met' if r['send']['ratio_p50'] <= SEND_GOAL else 'not met'})"
            if r["backend"] == "sqlite"
            else "(for reference; the goal is measured on SQLite)"
        )
        for r in results
    ]
    lines = [
        f"spanner_queues core benchmark: {seconds:g} s per measurement, one thread, "
        f"nproc={_nproc()}, Python {platform.python_version()}, "
        f"Django {results[0]['info']['django']}",
        *(f"  {BACKENDS[r['backend']]}: {r['info']['database']}" for r in results),
        "",
        " " * first + "".join(n.ljust(width) for n in names),
    ]
    for label, cells in rows:
        lines.append(label.ljust(first) + "".join(c.ljust(width) for c in cells))
    lines += ["", "issue 14 goal (ratio of p50s, create() + send() / create()):"]
    lines += [f"  {g}" for g in goals]
    lines += [
        f"  bound on {BACKENDS[r['backend']]}: the same row by a hand-written INSERT "
        f"(parameters prepared beforehand) {r['send']['raw_ratio_p50']:.2f}x"
        for r in results
    ]
    only = " --sqlite-only" if [r["backend"] for r in results] == ["sqlite"] else ""
    lines.append(f"  reproduce: .venv/bin/python benchmarks/core.py{only} --seconds {seconds:g}")
    return "\n".join(line.rstrip() for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sqlite-only", action="store_true", help="skip the Spanner emulator")
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement (2)")
    parser.add_argument("--depth", type=int, default=None, help="messages queued before claims")
    parser.add_argument("--json", action="store_true", help="also print the raw results")
    parser.add_argument("--child", choices=sorted(BACKENDS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.seconds, args.depth or DEPTH[args.child])
        return
    backends = ["sqlite"] if args.sqlite_only else ["sqlite", "emulator"]
    load_before = os.getloadavg()[0]
    results = [run_child(b, args.seconds, args.depth) for b in backends]
    print(report(results, args.seconds))
    print(
        f"load average (1 min) before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f} "
        "(other processes sharing the CPUs raise it)"
    )
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

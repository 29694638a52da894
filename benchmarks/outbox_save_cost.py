"""Outbox benchmark: the cost of a save on a registered model against an unregistered one.

    .venv/bin/python benchmarks/outbox_save_cost.py                 # SQLite, then the emulator
    .venv/bin/python benchmarks/outbox_save_cost.py --sqlite-only
    .venv/bin/python benchmarks/outbox_save_cost.py --seconds 5 --json

``tests.outboxapp.Plain`` and ``Tracked`` are identical models; ``Tracked`` is registered with
``outbox.register(Tracked, queue=ModelEvents)`` (every event, every field, default key and
payload). In one run, alternating rounds of 10 so that drift hits both alike, single-threaded:

- ``create``: ``with atomic(): M.objects.create(...)`` (registered: + one message INSERT);
- ``update``: ``with atomic(): obj.counter += 1; obj.save()`` (registered: + the SELECT of the
  tracked fields that decides what changed, + one message INSERT);
- ``save, no change``: ``with atomic(): obj.save()`` (registered: + that SELECT, no message);
- ``delete``: ``with atomic(): obj.delete()`` (registered: + one message INSERT, and Django's
  fast delete is off for the model because it has a ``pre_delete`` receiver);
- for reference, ``create + hand-written send``: the unregistered create plus
  ``ModelEvents.send(...)`` in the same block, i.e. what the outbox automates.

Each backend runs in a child process on a fresh database: a new SQLite file (WAL,
``transaction_mode="IMMEDIATE"``, as in ``tests/settings.py``) in a temporary directory, or a
private ``emulator_main`` on a free loopback port with a new database.
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
BACKENDS = {"sqlite": "SQLite (WAL, IMMEDIATE)", "emulator": "Spanner emulator"}
OPS = ("create", "update", "save_unchanged", "delete")
#: issue 14: a write of a registered model costs at most 1.5x an unregistered one (p50s)
SAVE_GOAL = 1.5


def _configure(backend: str, workdir: str) -> str:
    sys.path.insert(0, str(ROOT))
    from django.conf import settings

    apps = ["django.contrib.auth", "django.contrib.contenttypes", "spanner_queues"]
    apps.append("tests.outboxapp")
    if backend == "sqlite":
        import sqlite3

        database: dict[str, Any] = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(Path(workdir) / "outbox.sqlite3"),
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
        }
        described = f"SQLite {sqlite3.sqlite_version}"
    else:
        from spanner_queues_emulator import ensure_database, ensure_emulator

        os.environ.pop("SPANNER_EMULATOR_HOST", None)  # always a fresh private emulator
        instance, name = "sq-bench", f"sqoutbox{os.getpid()}"
        ensure_emulator(instance)
        ensure_database(instance, name)
        database = {
            "ENGINE": "django_spanner",
            "PROJECT": "test-project",
            "INSTANCE": instance,
            "NAME": name,
        }
        apps.insert(0, "django_spanner")  # must be first
        described = "Spanner emulator (emulator_main, fresh)"
    settings.configure(
        SECRET_KEY="benchmarks-only-not-secret",
        DEBUG=False,
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=apps,
        DATABASES={"default": database},
        SPANNER_QUEUES={"default": {"ENGINE": "table", "DATABASE": "default"}},
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return f"{described}, Django {django.get_version()}"


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "p50_ms": statistics.median(ordered) * 1000,
        "mean_ms": statistics.fmean(ordered) * 1000,
    }


def _measure(seconds: float) -> dict[str, Any]:
    from django.db import transaction

    from spanner_queues import outbox
    from tests.outboxapp.models import ModelEvents, Plain, Tracked

    outbox.register(Tracked, queue=ModelEvents)
    counter = iter(range(10**9))

    refills: list[Callable[[], None]] = []

    def variants(model: Any) -> dict[str, Callable[[], None]]:
        with transaction.atomic():
            obj = model.objects.create(name="bench")
        doomed: list[Any] = []

        def create() -> None:
            with transaction.atomic():
                model.objects.create(name="bench")

        def update() -> None:
            with transaction.atomic():
                obj.counter += 1
                obj.save()

        def save_unchanged() -> None:
            with transaction.atomic():
                obj.save()

        def refill() -> None:  # outside the timed calls; bulk_create sends no signals
            if len(doomed) < 20:
                doomed.extend(model.objects.bulk_create([model(name="d") for _ in range(100)]))

        def delete() -> None:
            victim = doomed.pop()
            with transaction.atomic():
                victim.delete()

        refills.append(refill)

        return {
            "create": create,
            "update": update,
            "save_unchanged": save_unchanged,
            "delete": delete,
        }

    def create_send() -> None:
        with transaction.atomic():
            row = Plain.objects.create(name="bench")
            ModelEvents.send(
                object_id=row.pk,
                message_id=f"m{next(counter)}",
                payload={"model": "outboxapp.plain", "pk": row.pk, "event": "created"},
            )

    plain, tracked = variants(Plain), variants(Tracked)
    results: dict[str, Any] = {}
    for op in (*OPS, "create_send"):
        pair = (
            {"plain": plain["create"], "manual": create_send}
            if op == "create_send"
            else {"plain": plain[op], "registered": tracked[op]}
        )
        for fn in pair.values():  # warm up statement caches and sessions
            for refill in refills:
                refill()
            for _ in range(10):
                fn()
        samples: dict[str, list[float]] = {name: [] for name in pair}
        deadline = time.perf_counter() + 2 * seconds
        while time.perf_counter() < deadline:
            for name, fn in pair.items():
                for refill in refills:
                    refill()
                for _ in range(10):
                    t0 = time.perf_counter()
                    fn()
                    samples[name].append(time.perf_counter() - t0)
        stats = {name: _ms(s) for name, s in samples.items()}
        other = "manual" if op == "create_send" else "registered"
        stats["ratio_p50"] = stats[other]["p50_ms"] / stats["plain"]["p50_ms"]
        stats["ratio_mean"] = stats[other]["mean_ms"] / stats["plain"]["mean_ms"]
        results[op] = stats
    return results


def child(backend: str, seconds: float) -> None:
    with tempfile.TemporaryDirectory(prefix="sq-outbox-bench-") as workdir:
        result = {"backend": backend, "database": _configure(backend, workdir)}
        result["ops"] = _measure(seconds)
        from django.db import connections

        connections.close_all()
    print("RESULT " + json.dumps(result), flush=True)


def run_child(backend: str, seconds: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", backend, "--seconds", str(seconds)]
    print(f"running {BACKENDS[backend]} ...", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"{backend} benchmark failed (exit {proc.returncode})")
    return json.loads(lines[-1][len("RESULT ") :])


LABELS = {
    "create": "create",
    "update": "update (1 field changed)",
    "save_unchanged": "save, no change",
    "delete": "delete",
    "create_send": "create + hand-written send",
}


def report(results: list[dict[str, Any]], seconds: float) -> str:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    lines = [
        f"outbox save cost: {seconds:g} s per variant, alternating rounds of 10, one thread, "
        f"nproc={cpus}, Python {platform.python_version()}",
    ]
    for r in results:
        lines += ["", f"{BACKENDS[r['backend']]}: {r['database']}"]
        lines.append(
            f"  {'operation (in atomic())':30}{'unregistered p50':>18}{'registered p50':>16}"
            f"{'ratio p50':>11}{'ratio mean':>12}{'runs':>7}"
        )
        for op, label in LABELS.items():
            s = r["ops"][op]
            other = s.get("registered") or s["manual"]
            name = "(manual)" if op == "create_send" else ""
            lines.append(
                f"  {label:30}{s['plain']['p50_ms']:>15.3f} ms{other['p50_ms']:>13.3f} ms"
                f"{s['ratio_p50']:>10.2f}x{s['ratio_mean']:>11.2f}x{other['n']:>7} {name}"
            )
        worst = max(OPS, key=lambda op: r["ops"][op]["ratio_p50"])
        ratio = r["ops"][worst]["ratio_p50"]
        lines.append(
            f"  issue 14 goal: registered / unregistered {ratio:.2f}x at worst ({LABELS[worst]}) "
            f"(goal <= {SAVE_GOAL:.2f}x: {'met' if ratio <= SAVE_GOAL else 'not met'})"
        )
    lines.append(
        "reproduce: .venv/bin/python benchmarks/outbox_save_cost.py --sqlite-only "
        f"--seconds {seconds:g}"
    )
    return "\n".join(line.rstrip() for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sqlite-only", action="store_true", help="skip the Spanner emulator")
    parser.add_argument("--seconds", type=float, default=2.0, help="per variant (2)")
    parser.add_argument("--json", action="store_true", help="also print the raw results")
    parser.add_argument("--child", choices=sorted(BACKENDS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.seconds)
        return
    backends = ["sqlite"] if args.sqlite_only else ["sqlite", "emulator"]
    load_before = os.getloadavg()[0]
    results = [run_child(b, args.seconds) for b in backends]
    print(report(results, args.seconds))
    print(
        f"load average (1 min) before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f} "
        "(other processes sharing the CPUs raise it)"
    )
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

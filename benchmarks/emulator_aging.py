"""How Google's Spanner emulator slows as it serves: no code of this project in the path.

    .venv/bin/python benchmarks/emulator_aging.py [--rounds 6] [--cycles 1000]

Starts a private ``emulator_main`` twice (nothing else talks to it) with one table and, with
Google's client alone, runs ``--cycles`` cycles per round of two read-write transactions:
INSERT a row, then DELETE it. ``same`` uses one key every time; ``distinct`` a new key each
cycle, as a queue's messages do. Before each round it times (median of 10):

- a strong single-use read of ``SELECT 1``: it grows with every call the emulator has served,
  in both runs. The emulator dates a read at its clock, which advances one microsecond whenever
  it is read twice within one, so runs ahead of the wall clock for good, and the read waits
  until the wall clock catches up (``LockManager::WaitForSafeRead``;
  GoogleCloudPlatform/cloud-spanner-emulator#277, open);
- ``SELECT MIN(V)`` of the (empty) table in a read-write transaction, which has no such wait:
  it grows only with ``distinct``. A deleted row's key stays in the emulator's in-memory table
  for good (``InMemoryStorage::Delete`` marks it deleted; nothing erases it), and every scan
  walks it.

Both are the emulator's, not Spanner's; the soak (``soak.py``) reports the first beside its
latency (``read_ms``). Figures: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "emulator"))


def median_ms(run: Callable[[], Any], times: int = 10) -> float:
    took = []
    for _ in range(times):
        began = time.perf_counter()
        run()
        took.append(time.perf_counter() - began)
    return round(statistics.median(took) * 1e3, 2)


def measure(keys: str, rounds: int, cycles: int) -> list[dict[str, Any]]:
    from google.cloud import spanner

    from spanner_queues_emulator.process import start_emulator, terminate

    host, proc = start_emulator()
    os.environ["SPANNER_EMULATOR_HOST"] = host
    try:
        client = spanner.Client(project="aging")
        instance = client.instance(
            "aging",
            configuration_name="projects/aging/instanceConfigs/emulator-config",
            node_count=1,
        )
        instance.create().result()
        database = instance.database(
            "aging", ddl_statements=["CREATE TABLE T (K STRING(36), V INT64) PRIMARY KEY (K)"]
        )
        database.create().result()
        text = {"k": spanner.param_types.STRING}

        def strong_read() -> None:
            with database.snapshot() as snapshot:
                list(snapshot.execute_sql("SELECT 1"))

        def scan() -> None:
            database.run_in_transaction(lambda tx: list(tx.execute_sql("SELECT MIN(V) FROM T")))

        def cycle(key: str) -> None:
            for sql in ("INSERT INTO T (K, V) VALUES (@k, 1)", "DELETE FROM T WHERE K = @k"):
                database.run_in_transaction(
                    lambda tx, sql=sql: tx.execute_update(sql, params={"k": key}, param_types=text)
                )

        rows = []
        done = 0
        for _ in range(rounds + 1):
            rows.append(
                {
                    "keys": keys,
                    "cycles": done,
                    "strong_read_ms": median_ms(strong_read),
                    "rw_scan_ms": median_ms(scan),
                }
            )
            print(
                f"  {keys:8} after {done:6d} cycles: strong read {rows[-1]['strong_read_ms']:7.2f}"
                f" ms, read-write scan {rows[-1]['rw_scan_ms']:7.2f} ms",
                flush=True,
            )
            if len(rows) > rounds:
                break
            for _ in range(cycles):
                cycle(uuid.uuid4().hex if keys == "distinct" else "same")
            done += cycles
        return rows
    finally:
        terminate(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--cycles", type=int, default=1000, help="insert+delete cycles a round")
    args = parser.parse_args()
    print(f"emulator aging: {args.rounds} rounds of {args.cycles} insert+delete cycles")
    for keys in ("same", "distinct"):
        rows = measure(keys, args.rounds, args.cycles)
        first, last = rows[0], rows[-1]
        print(
            f"{keys}: strong read {first['strong_read_ms']} -> {last['strong_read_ms']} ms "
            f"({last['strong_read_ms'] / first['strong_read_ms']:.1f}x), read-write scan "
            f"{first['rw_scan_ms']} -> {last['rw_scan_ms']} ms "
            f"({last['rw_scan_ms'] / first['rw_scan_ms']:.1f}x) after {last['cycles']} cycles"
        )


if __name__ == "__main__":
    main()

"""The commit floor of ``tasks_vs_django_tasks_db.py``'s drain: 1,000 ops of ``BEGIN
IMMEDIATE; INSERT; DELETE; COMMIT`` (one commit per op, the worker's per task) against two such
transactions per op (``db_worker``'s claim and result), three alternating rounds, raw sqlite3 on
a fresh SQLite file (WAL, ``synchronous`` FULL or the argument)::

    .venv/bin/python benchmarks/commit_floor.py [FULL|NORMAL]
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
import time

path = os.path.join(tempfile.mkdtemp(), "floor.sqlite3")
c = sqlite3.connect(path, isolation_level=None)
c.execute("PRAGMA journal_mode=WAL")
c.execute(f"PRAGMA synchronous={sys.argv[1] if len(sys.argv) > 1 else 'FULL'}")
c.execute("CREATE TABLE t (id TEXT PRIMARY KEY, v TEXT)")
N = 1000


def op(i: int, commits: int) -> None:
    for k in range(commits):
        c.execute("BEGIN IMMEDIATE")
        c.execute("INSERT INTO t VALUES (?, ?)", (f"{i}-{k}", "x" * 200))
        c.execute("DELETE FROM t WHERE id = ?", (f"{i}-{k}",))
        c.execute("COMMIT")


out: dict[int, list[float]] = {}
for _round in range(3):
    for commits in (1, 2):
        t0 = time.perf_counter()
        for i in range(N):
            op(i, commits)
        out.setdefault(commits, []).append(time.perf_counter() - t0)
for commits, ts in out.items():
    per_s = N * len(ts) / sum(ts)
    print(f"{commits} commit(s) per op: {per_s:.0f} ops/s ({1000 / per_s:.3f} ms/op)")

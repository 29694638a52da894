"""Does the table engine's hand-compiled SQL pay? Claim+ack with it and with the ORM.

    .venv/bin/python benchmarks/hand_sql_vs_orm.py                    # SQLite and PostgreSQL
    .venv/bin/python benchmarks/hand_sql_vs_orm.py --backend sqlite --rounds 8

``spanner_queues.engines.table.RowStatements`` writes the claim's compare-and-set UPDATE,
the ack's DELETE (by key, and by key + lease token) and the lease-token read once per queue, and
runs them with parameters prepared by the fields. The ORM equivalents are the querysets they
stand for: ``filter(<key>, DeliverTime=<read>)._update_bookkeeping(...)``,
``filter(<key>[, lease_token=...])._raw_delete()`` and ``values_list("lease_token")``.

Both run the same loop, ``receive(max_messages=1)`` then ``ack`` in its own ``atomic()`` on a
queue of ``--depth`` messages (``benchmarks/core.py``'s "single" mode), in alternating rounds so
that drift hits both alike; printed: the median messages/s of each and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _orm_statements() -> dict[str, Any]:
    """ORM versions of RowStatements' hand-compiled statements (same signatures)."""
    from spanner_queues.keys import key_filter
    from spanner_queues.storage import rows

    def _rows(self: Any, key: Sequence[Any]) -> Any:
        model = self.key[0].model
        return rows(model, self.using).filter(key_filter(model, tuple(key)))

    def claim(self: Any, c: Any) -> int:
        return (
            _rows(self, c.key)
            .filter(deliver_time=c.was_due)
            ._update_bookkeeping(
                lease_token=c.lease_token,
                lease_expires_at=c.lease_expires_at,
                attempts=c.attempts,
                deliver_time=c.deliver_time,
            )
        )

    def held_by(self: Any, key: Sequence[Any]) -> list[str | None]:
        return list(_rows(self, key).values_list("lease_token", flat=True))

    def delete(self: Any, key: Sequence[Any], lease_token: str | None = None) -> int:
        qs = _rows(self, key)
        if lease_token is not None:
            qs = qs.filter(lease_token=lease_token)
        return int(qs._raw_delete(self.using))

    return {"claim": claim, "held_by": held_by, "delete": delete}


def child(backend: str, rounds: int, depth: int) -> None:
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="sq-bench-") as workdir:
        if backend == "postgres":
            os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
            os.environ["SQ_BENCH_DATABASE"] = "postgres"
            import django
            from django.core.management import call_command

            django.setup()
            call_command("migrate", verbosity=0)
        else:
            from benchmarks.core import _setup

            _setup(backend, workdir)
        from benchmarks.core import _claim_ack
        from spanner_queues.engines.table import RowStatements

        hand = {name: getattr(RowStatements, name) for name in ("claim", "held_by", "delete")}
        orm = _orm_statements()
        rates: dict[str, list[float]] = {"hand": [], "orm": []}
        _claim_ack("single", min(depth, 200), 1.0)  # warm up
        for _ in range(rounds):
            for name, methods in (("hand", hand), ("orm", orm)):
                for attr, fn in methods.items():
                    setattr(RowStatements, attr, fn)
                rates[name].append(_claim_ack("single", depth, 60.0)["per_second"])
        for attr, fn in hand.items():
            setattr(RowStatements, attr, fn)
    h, o = statistics.median(rates["hand"]), statistics.median(rates["orm"])
    print(
        f"{backend:>9}: hand-compiled {h:,.0f} msg/s, ORM {o:,.0f} msg/s, "
        f"hand/ORM {h / o:.3f}x ({rounds} rounds of {depth} messages, medians)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], action="append")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--depth", type=int, default=2000)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rounds, args.depth)
        return
    sys.path.insert(0, str(ROOT))
    for backend in args.backend or ["sqlite", "postgres"]:
        if backend == "postgres":
            from tests.postgres_server import ensure_postgres

            os.environ.pop("SQ_PG_PORT", None)
            ensure_postgres()  # sets SQ_PG_PORT for the child; stopped at exit
        cmd = [sys.executable, __file__, "--child", backend, "--rounds", str(args.rounds)]
        subprocess.run([*cmd, "--depth", str(args.depth)], check=True, cwd=ROOT)
    print(
        f"load average {os.getloadavg()[0]:.2f}; reproduce: python benchmarks/hand_sql_vs_orm.py "
        + " ".join(sys.argv[1:])
    )


if __name__ == "__main__":
    main()

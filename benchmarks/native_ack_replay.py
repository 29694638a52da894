"""Is an ack exactly-once when spanner_dbapi replays an aborted transaction?

    .venv/bin/python benchmarks/native_ack_replay.py [-n 200]

Starts a private ``emulator_main --enable_fault_injection`` (it aborts commits at random),
the queue-aware front before it (in this process), and a fresh test database
(``tests.settings_spanner_native``). Then N receiver transactions, each ``atomic():
Account.objects.create(); <ack one message>``, for two ways of acking:

- ``dml``: the engine's ack, ``DELETE ... ASSERT_ROWS_MODIFIED`` in the transaction;
- ``mutation``: an ``Ack`` mutation buffered on the DB-API's transaction, riding in its commit.

An aborted commit is replayed by the DB-API from its recorded statements. It prints how many
receiver transactions committed and how many of those left their message unacked (work that
would be done again): the figure issue 20 asked for before choosing how a receiver acks.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=200, help="receiver transactions per way")
    args = parser.parse_args()
    from spanner_queues_emulator.process import find_emulator, free_port, terminate

    port = free_port()
    proc = subprocess.Popen(
        [find_emulator(), "--host_port", f"127.0.0.1:{port}", "--enable_fault_injection"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.02)
        from spanner_queues_emulator.front import serve

        server, front = serve(f"127.0.0.1:{port}", "127.0.0.1:0")
        os.environ["SPANNER_EMULATOR_HOST"] = f"127.0.0.1:{server.bound_port}"
        os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings_spanner_native"
        try:
            run(args.n)
        finally:
            front.shutdown()
            server.stop(0)
    finally:
        terminate(proc)


def run(n: int) -> None:
    import django

    django.setup()
    from django.db import connection, transaction

    from spanner_queues import api
    from tests.testapp.models import Account, Jobs

    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    for how in ("dml", "mutation"):
        Account.objects.all().delete()
        ids = [f"{how}{i}" for i in range(n)]
        for start in range(0, n, 400):
            for _ in range(20):  # the fault injection aborts these too
                try:
                    with transaction.atomic():
                        api.send_many(
                            Jobs, [{"id": i, "payload": b""} for i in ids[start : start + 400]]
                        )
                    break
                except Exception:
                    continue
        failed = 0
        for message_id in ids:
            try:
                with transaction.atomic():
                    Account.objects.create(name=message_id)
                    if how == "dml":
                        api.ack_many(Jobs, [(message_id,)])
                    else:
                        connection.connection.transaction_checkout().ack(
                            queue=Jobs._meta.db_table, key=[message_id]
                        )
            except Exception:
                failed += 1  # rolled back as a whole: nothing committed, nothing acked
        committed = Account.objects.count()
        unacked = Jobs.objects.filter(id__startswith=how).count()
        print(
            f"{how:8} {n} receiver transactions: {committed} committed, {failed} failed; "
            f"committed with their ack lost: {unacked - (n - committed)}"
        )


if __name__ == "__main__":
    main()

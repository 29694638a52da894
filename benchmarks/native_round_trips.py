"""Spanner calls per message on the native engine, counted at the gRPC client.

    .venv/bin/python benchmarks/native_round_trips.py            # a private front (emulator)
    SPANNER_PROJECT=P SPANNER_INSTANCE=I SPANNER_DATABASE=D \
      DJANGO_SETTINGS_MODULE=tests.settings_real_spanner \
      .venv/bin/python benchmarks/native_round_trips.py

The database and the engine come from the Django settings (default
``tests.settings_spanner_native``, which starts a private emulator behind the queue-aware
front): any settings whose ``SPANNER_QUEUES["default"]`` is the native engine and whose
``INSTALLED_APPS`` hold ``tests.testapp`` work unchanged, a real instance's included
(``tests.settings_real_spanner``, as ``bin/test-real-spanner`` runs it). The run creates a
test database (``connection.creation.create_test_db``: ``test_<NAME>`` or ``TEST["NAME"]``),
migrates it (``CREATE QUEUE``) and drops it at the end.

Every Spanner API call of the process (every thread, unary and streaming) is counted by a gRPC
client interceptor (``tests.native.grpc_calls``); session management is left out. Scenarios:

- ``send``: N transactions, each ``atomic(): Jobs.send(payload=...)``;
- ``single-message drain``: N messages drained by ``Worker(burst=True)`` with an atomic no-op
  receiver (its transaction is the ack);
- ``batch drain``: N messages drained by a batch receiver (``max_batch_size=20``);
- ``... writing, long-running`` / ``... writing, --burst``: the same receivers, each run
  writing one row (``Account``) in its transaction (the ack's), drained by a long-running
  worker stopped as SIGTERM stops it (``Worker.stop()``) once every message was processed, and
  by a burst worker; ``--workloads`` picks scenarios by name;
- ``bulk send``: 1,000 messages in one transaction (``send_many``).

Counts include the RECEIVE stream's calls and its lease renewals; per-method counts follow.
The exit status is 1 when a scenario failed (its error is printed on its line).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings_spanner_native")
    import django

    django.setup()


def _describe(exc: BaseException) -> str:
    """The Spanner error's text (Django wraps DB-API wraps gRPC), on one line."""
    from google.api_core.exceptions import GoogleAPICallError

    from spanner_queues.drivers import causes

    for error in causes(exc):
        if isinstance(error, GoogleAPICallError):
            return f"{type(error).__name__}: {error.message}".splitlines()[0][:160]
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:160]


def _drain(
    worker_cls: Any, registry: Any, model: Any, *, burst: bool = True, done: Any = None
) -> None:
    """Run a worker until the queue is drained: a burst worker returns by itself; a
    long-running one is stopped as SIGTERM stops it once ``done`` (an Event) is set."""
    worker = worker_cls(
        [model],
        registry=registry,
        burst=burst,
        install_signal_handlers=False,
        summary_interval=None,
    )
    if burst:
        worker.run()
        return
    import threading

    def stop_when_done() -> None:
        done.wait(600)
        worker.stop()

    stopper = threading.Thread(target=stop_when_done, daemon=True)
    stopper.start()
    worker.run()
    stopper.join(10)


def _counting_writer(account: Any, count: int, done: Any) -> Any:
    """A receiver's body: write one row per run, set ``done`` once ``count`` were processed."""
    processed = [0]

    def write(messages: Any) -> None:
        account.objects.create(name=f"done {len(messages)}")
        processed[0] += len(messages)
        if processed[0] >= count:
            done.set()

    return write


def run(n: int, bulk: int, workloads: str = "") -> dict[str, Any]:
    import threading

    from django.db import connection, transaction

    from spanner_queues import api
    from spanner_queues.engines import engines
    from spanner_queues.receivers import ReceiverRegistry, receiver
    from spanner_queues.worker import Worker
    from tests.native.grpc_calls import counting
    from tests.testapp.models import Account, Jobs

    engine = engines["default"]
    results: dict[str, Any] = {}

    def measure(name: str, messages: int, work: Any) -> None:
        if workloads and not any(w in name for w in workloads.split(",")):
            return
        with counting() as counter:
            started = time.monotonic()
            error = None
            try:
                work()
            except Exception as exc:  # a scenario that fails is reported, not hidden
                error = _describe(exc)
            seconds = time.monotonic() - started
            calls = counter.work_calls()
            statements = counter.statements()
            sessions = sum(counter.snapshot().values()) - sum(calls.values())
        total = sum(calls.values())
        results[name] = {
            "messages": messages,
            "calls": total,
            "calls_per_message": round(total / messages, 3),
            "session_calls": sessions,
            "by_method": dict(sorted(calls.items())),
            "by_statement": dict(sorted(statements.items())),
            "seconds": round(seconds, 2),
            "error": error,
        }

    def send_each() -> None:
        for i in range(n):
            with transaction.atomic():
                Jobs.send(id=f"s{i}", payload=b"x")

    def fill(count: int, prefix: str) -> None:
        specs = [{"id": f"{prefix}{i}", "payload": b"x"} for i in range(count)]
        for start in range(0, count, 400):  # under the 950-parameter limit on every version
            with transaction.atomic():
                api.send_many(Jobs, specs[start : start + 400])

    measure("send", n, send_each)
    engine.purge(Jobs)

    single = ReceiverRegistry()
    receiver(Jobs, registry=single)(lambda message: None)
    fill(n, "d")
    measure("single-message drain", n, lambda: _drain(Worker, single, Jobs))
    engine.stop_receiving(wait=30)
    engine.purge(Jobs)

    batch = ReceiverRegistry()
    receiver(Jobs, registry=batch, batch=True, max_batch_size=20)(lambda messages: None)
    fill(n * 2, "b")
    measure("batch drain (batch receiver of 20)", n * 2, lambda: _drain(Worker, batch, Jobs))
    engine.stop_receiving(wait=30)
    engine.purge(Jobs)

    for batch_size in (1, 20):
        count = n if batch_size == 1 else n * 5
        for burst in (False, True):
            done = threading.Event()
            registry = ReceiverRegistry()
            counted = _counting_writer(Account, count, done)
            if batch_size == 1:
                receiver(Jobs, registry=registry)(lambda message, c=counted: c([message]))
            else:
                receiver(Jobs, registry=registry, batch=True, max_batch_size=20)(counted)
            fill(count, "w")
            kind = "single" if batch_size == 1 else "batch of 20"
            mode = "--burst" if burst else "long-running"
            measure(
                f"{kind} writing, {mode}",
                count,
                lambda r=registry, b=burst, d=done: _drain(Worker, r, Jobs, burst=b, done=d),
            )
            engine.stop_receiving(wait=30)
            engine.purge(Jobs)
            Account.objects.all().delete()

    def bulk_send() -> None:
        with transaction.atomic():
            api.send_many(Jobs, [{"id": f"k{i}", "payload": b"x"} for i in range(bulk)])

    measure(f"bulk send ({bulk} in one transaction)", bulk, bulk_send)
    engine.purge(Jobs)
    results["_database"] = connection.settings_dict["NAME"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=40, help="messages per scenario (default 40)")
    parser.add_argument("--bulk", type=int, default=1000, help="bulk send size (default 1000)")
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    parser.add_argument(
        "--workloads", default="", help="comma-separated parts of scenario names to run"
    )
    args = parser.parse_args()
    _setup()
    from django.db import connection

    from spanner_queues.engines import engines

    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        results = run(args.n, args.bulk, args.workloads)
    finally:
        engines["default"].stop_receiving(wait=30)
        connection.creation.destroy_test_db(old_name, verbosity=0)
    failed = any(r["error"] for k, r in results.items() if not k.startswith("_"))
    if args.json:
        print(json.dumps(results, indent=2))
        sys.exit(1 if failed else 0)
    print(f"Spanner calls per message, counted at the gRPC client ({results.pop('_database')})")
    for name, r in results.items():
        line = f"{name:40} {r['calls_per_message']:7.3f} ({r['calls']} calls, {r['messages']} msgs)"
        if r["error"]:
            line += f"  FAILED: {r['error']}"
        print(line)
        print(f"{'':40} {r['by_method']} (+ {r['session_calls']} session calls)")
        print(f"{'':40} {r['by_statement']}")
    sys.exit(1 if failed else 0)  # a scenario failed: callers (scripts, CI) see it


if __name__ == "__main__":
    main()

"""The Pub/Sub relay's throughput against Google's client publishing alone, in one run, on one
Pub/Sub emulator.

    .venv/bin/python benchmarks/pubsub_relay.py                      # 5000 messages a round
    .venv/bin/python benchmarks/pubsub_relay.py --messages 20000 --concurrency 4 --json
    .venv/bin/python benchmarks/pubsub_relay.py --ds tests.settings_pubsub_native  # native queues
    .venv/bin/python benchmarks/pubsub_relay.py --postgres --concurrency 1

Each round, alternating so that drift hits both alike:

- ``client``: a ``PublisherClient`` publishes N messages with the relay's attributes and
  ordering keys (the payloads and keys of the queue's messages, built before the clock), then
  waits for every confirmation: the rate the bus takes. Twice, and the better is the reference:
  with the client's default batches in the queue's order (``client-default``) and with the
  relay's old ones (``client-relay``: ``BATCH_SETTINGS``, each ordering key's messages together);
  message ordering on in both, as it must be for ordering keys, no client retry;
- ``relay``: the same N messages sent to ``pubsubapp.OrderEvents`` (SQLite, WAL, as in
  tests/settings.py) are relayed by a ``Worker`` in this process (``--burst``, ``--concurrency``
  threads, batches of ``RELAY_BATCH_SIZE``): receive, publish, wait, ack, from the first receive
  to the empty queue.

- ``drainer``: the loop a team would write instead of the relay (issue 39), in this process, on
  the same database, client settings and topic: read the 500 oldest rows, publish them (each
  ordering key's together, as the relay does; no ordering key when unordered), wait for every
  confirmation, delete them by key in one statement; until the queue is empty. No lease, no
  back-off, no dead letters, and it cannot run twice at once: the relay's goal is 0.9 of it.

- ``queue``, for where the relay is bounded: the same worker with a receiver that publishes
  nothing (receive and ack alone): the queue's own ceiling on this database.

After the timed rounds one more relay round is counted, not timed: publish requests (RPCs to
Pub/Sub) and, on a SQL database, statements and commits, or on Spanner the API calls by
method (``tests.native.grpc_calls``), per message. ``--ds`` runs the queue on a test settings
module's database instead of SQLite (``tests.settings_pubsub_native``: native queues on the
emulator front, which it starts); ``--postgres`` on a private PostgreSQL server with durable
commits (``sqlite_bench.postgres_database``).

Two key shapes: ``keyed`` (50 orders, so 50 ordering keys: the default ordering key, the
order) and ``unordered`` (``pubsub_ordering_key = ()``). The goal (issue 32): the relay at least
80 % of the client's rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOAL = 0.80
#: issue 39: the relay at least this share of the hand-written drainer's rate
DRAINER_GOAL = 0.9
#: per relay or queue round, the deliveries whose lease ran out before their ack
REDELIVERED: list[int] = []
ORDERS = 50


def batch_settings() -> Any:
    """The client's batches of the reference rounds and the drainer: up to Pub/Sub's 1,000
    messages a publish request (the client's default is 100), as the relay used them before it
    sent its own requests (``spanner_queues.contrib.pubsub.publish``)."""
    from google.cloud.pubsub_v1 import types

    return types.BatchSettings(max_messages=1000)


def configure_module(module: str, batch: int) -> None:
    """Django from the test settings ``module``, on a fresh test database."""
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = module
    from django.conf import settings

    settings.SPANNER_QUEUES_PUBSUB = {"PROJECT": "sq-bench", "RELAY_BATCH_SIZE": batch}
    engine = settings.SPANNER_QUEUES["default"]
    # 60 s leases as on SQLite, where the engine takes a lease length (native: Spanner's 10 s)
    options = {**engine.get("OPTIONS", {}), "LEASE_SECONDS": 60}
    settings.SPANNER_QUEUES = {**settings.SPANNER_QUEUES, "default": {**engine, "OPTIONS": options}}
    import django

    django.setup()
    from django.db import connection

    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)


def configure(workdir: str, batch: int, postgres: str | None = None) -> None:
    """Django on a fresh SQLite file in ``workdir`` or, given ``host:port/name``
    (``sqlite_bench.postgres_database``), on that PostgreSQL database."""
    sys.path.insert(0, str(ROOT))
    from django.conf import settings

    database: dict[str, Any] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(workdir, "bench.sqlite3"),
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        },
        "CONN_MAX_AGE": None,
    }
    if postgres is not None:
        from tests.postgres_server import SUPERUSER

        address, name = postgres.split("/")
        host, port = address.rsplit(":", 1)
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": host,
            "PORT": port,
            "NAME": name,
            "USER": SUPERUSER,
            "CONN_MAX_AGE": None,
        }

    settings.configure(
        SECRET_KEY="benchmarks-only-not-secret",
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "spanner_queues",
            "spanner_queues.contrib.pubsub",
            "tests.pubsubapp",
        ],
        DATABASES={"default": database},
        SPANNER_QUEUES={
            "default": {
                "ENGINE": "spanner_queues.engines.table.TableQueueEngine",
                "DATABASE": "default",
                "OPTIONS": {"LEASE_SECONDS": 60},
            }
        },
        SPANNER_QUEUES_PUBSUB={"PROJECT": "sq-bench", "RELAY_BATCH_SIZE": batch},
    )
    import django

    django.setup()


def messages(n: int) -> list[dict[str, Any]]:
    return [
        {
            "order": i % ORDERS,
            "message_id": uuid.uuid4().hex,
            "payload": {"model": "shop.order", "pk": i, "event": "created"},
        }
        for i in range(n)
    ]


def client_round(
    specs: list[dict[str, Any]], topic: str, ordered: bool, batches: str = "relay"
) -> float:
    """Seconds Google's client takes to publish the messages and get every confirmation, with
    the relay's batch settings (``batches="relay"``) or the client's defaults (``"default"``)."""
    from google.cloud.pubsub_v1 import PublisherClient, types

    from spanner_queues import api
    from spanner_queues.contrib.pubsub.relay import event_id, key_text, ordering_key
    from spanner_queues.message import Message
    from tests.pubsubapp.models import OrderEvents

    # the bytes, attributes and ordering keys the relay would publish (built before the clock)
    built = [api.build_message(OrderEvents, s) for s in specs]
    rows = []
    for out in built:
        m = Message(
            queue="pubsubapp.OrderEvents",
            key=(out.key["order"], out.key["message_id"]),
            key_names=("order", "message_id"),
            payload=out.payload,
            deliver_time=None,
        )
        attrs = {"event_id": event_id(m), "queue": m.queue, "key": key_text(m)}
        rows.append((m.payload, ordering_key(OrderEvents, m) if ordered else "", attrs))
    options = types.PublisherOptions(enable_message_ordering=True)
    if batches == "relay":  # and in the relay's order: each ordering key's messages together
        rows.sort(key=lambda row: row[1])
        client = PublisherClient(batch_settings=batch_settings(), publisher_options=options)
    else:
        client = PublisherClient(publisher_options=options)
    started = time.perf_counter()
    futures = [
        client.publish(topic, data, ordering_key=key, retry=None, timeout=60, **attrs)
        for data, key, attrs in rows
    ]
    for f in futures:
        f.result(60)
    took = time.perf_counter() - started
    client.stop()
    return took


def drainer_round(specs: list[dict[str, Any]], topic: str, ordered: bool) -> float:
    """Seconds the hand-written drainer takes to publish and delete the messages."""
    from django.db import connection
    from google.cloud.pubsub_v1 import PublisherClient, types

    from tests.pubsubapp.models import OrderEvents

    OrderEvents.send_many(specs)
    options = types.PublisherOptions(enable_message_ordering=True)
    client = PublisherClient(batch_settings=batch_settings(), publisher_options=options)
    table = connection.ops.quote_name(OrderEvents._meta.db_table)
    order, message_id, payload, due = (
        connection.ops.quote_name(OrderEvents._meta.get_field(name).column)
        for name in ("order", "message_id", "payload", "deliver_time")
    )
    started = time.perf_counter()
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {order}, {message_id}, {payload} FROM {table} ORDER BY {due} LIMIT 500"
            )
            rows = cursor.fetchall()
        if not rows:
            break
        if ordered:
            rows.sort(key=lambda row: row[0])
        futures = [
            client.publish(
                topic,
                data if isinstance(data, bytes) else str(data).encode(),
                ordering_key=str(key) if ordered else "",
                retry=None,
                timeout=60,
                event_id=event,
            )
            for key, event, data in rows
        ]
        for f in futures:
            f.result(60)
        with connection.cursor() as cursor:
            marks = ", ".join(["%s"] * len(rows))
            cursor.execute(
                f"DELETE FROM {table} WHERE {message_id} IN ({marks})", [row[1] for row in rows]
            )
    took = time.perf_counter() - started
    client.stop()
    return took


def queue_round(specs: list[dict[str, Any]], concurrency: int) -> float:
    """``relay_round`` with a receiver that publishes nothing: receive and ack alone."""
    import dataclasses

    from spanner_queues.receivers import receivers

    # (the relay of the measured queue: tests.pubsubapp relays others too)
    [spec] = [s for s in receivers.all() if s.name.endswith(".relay[pubsubapp.OrderEvents]")]
    receivers.register(dataclasses.replace(spec, func=lambda context, messages: None))
    try:
        return relay_round(specs, concurrency)
    finally:
        receivers.register(spec)


def relay_round(specs: list[dict[str, Any]], concurrency: int, *, send: bool = True) -> float:
    """Seconds the relay takes to publish and ack the messages, first receive to empty queue
    (``send``: sent first, untimed; else the caller sent them)."""
    from spanner_queues.worker import Worker
    from tests.pubsubapp.models import OrderEvents

    if send:
        OrderEvents.send_many(specs)
    worker = Worker(
        ["pubsubapp.OrderEvents"],
        burst=True,
        concurrency=concurrency,
        install_signal_handlers=False,
        reseed_interval=None,
    )
    started = time.perf_counter()
    stats = worker.run()
    took = time.perf_counter() - started
    # every message published and acked; a delivery whose lease ran out meanwhile (native
    # leases are Spanner's 10 s, renewed by the worker) was published again, its ack refused
    assert not OrderEvents.objects.exists(), stats
    assert stats.processed + stats.already_acked == stats.received >= len(specs), stats
    REDELIVERED.append(stats.already_acked)
    return took


def counted_round(specs: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    """One relay round, counted (its sends not): publish RPCs, and statements and commits
    (SQL, every thread's: the relay's ack thread too) or Spanner API calls by method
    (Spanner), per message."""
    import collections
    import contextlib
    import threading

    from django.db import connections
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.utils import CursorWrapper
    from google.pubsub_v1.services.publisher import client as gapic

    from tests.pubsubapp.models import OrderEvents

    OrderEvents.send_many(specs)
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def bump(name: str) -> None:
        with lock:
            counts[name] += 1

    real_execute, real_executemany = CursorWrapper._execute, CursorWrapper._executemany

    def execute(self: Any, sql: str, *args: Any) -> Any:
        bump("execute " + sql.split(None, 1)[0].upper())
        return real_execute(self, sql, *args)

    def executemany(self: Any, sql: str, *args: Any) -> Any:
        bump("executemany " + sql.split(None, 1)[0].upper())
        return real_executemany(self, sql, *args)

    real_commit, real_publish = BaseDatabaseWrapper._commit, gapic.PublisherClient.publish

    def commit(self: Any) -> Any:
        bump("commit")
        return real_commit(self)

    def publish(self: Any, *args: Any, **kwargs: Any) -> Any:
        bump("publish RPC")
        return real_publish(self, *args, **kwargs)

    spanner = connections["default"].vendor == "spanner"
    if spanner:
        from tests.native.grpc_calls import counting

        counter_context: Any = counting()
    else:
        counter_context = contextlib.nullcontext()
        BaseDatabaseWrapper._commit = commit  # type: ignore[method-assign]
        CursorWrapper._execute = execute  # type: ignore[method-assign]
        CursorWrapper._executemany = executemany  # type: ignore[method-assign]
    gapic.PublisherClient.publish = publish  # type: ignore[method-assign]
    try:
        with counter_context as counter:
            relay_round(specs, concurrency, send=False)
    finally:
        gapic.PublisherClient.publish = real_publish  # type: ignore[method-assign]
        BaseDatabaseWrapper._commit = real_commit  # type: ignore[method-assign]
        CursorWrapper._execute = real_execute  # type: ignore[method-assign]
        CursorWrapper._executemany = real_executemany  # type: ignore[method-assign]
    if spanner:
        counts.update(counter.work_calls())
        counts.update({f"  of which {k}": v for k, v in counter.statements().items()})
    n = len(specs)
    return {name: round(v / n, 4) for name, v in sorted(counts.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500, help="RELAY_BATCH_SIZE")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--archive-days",
        type=int,
        help="ARCHIVE_DAYS (default: the setting's, 7: each published event archived; 0: none)",
    )
    parser.add_argument(
        "--ds", help="a test settings module for the queue's database (default: SQLite file)"
    )
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="the queue on a private PostgreSQL server (tests.postgres_server), durable commits",
    )
    args = parser.parse_args()

    from spanner_queues.testing.pubsub import PubSubEmulator

    with tempfile.TemporaryDirectory() as workdir, PubSubEmulator() as emulator:
        os.environ.update(emulator.env)
        if args.ds:
            configure_module(args.ds, args.batch)
        else:
            postgres = None
            if args.postgres:
                sys.path.insert(0, str(ROOT / "benchmarks"))
                sys.path.insert(0, str(ROOT))
                from sqlite_bench import postgres_database

                postgres = postgres_database()
            configure(workdir, args.batch, postgres)
        from django.conf import settings
        from django.core.management import call_command
        from google.cloud.pubsub_v1 import PublisherClient

        if args.archive_days is not None:
            archive = {"ARCHIVE_DAYS": args.archive_days}
            settings.SPANNER_QUEUES_PUBSUB = {**settings.SPANNER_QUEUES_PUBSUB, **archive}

        from spanner_queues.contrib.pubsub import relay

        call_command("migrate", verbosity=0)
        topic = "projects/sq-bench/topics/orders"
        PublisherClient().create_topic(name=topic)
        results: dict[str, dict[str, list[float]]] = {}
        counted: dict[str, dict[str, Any]] = {}
        for shape in ("keyed", "unordered"):
            ordered = shape == "keyed"
            real = relay.ordering_fields
            if not ordered:
                relay.ordering_fields = lambda model: ()  # type: ignore[assignment]
            rates: dict[str, list[float]] = {
                "client-default": [],
                "client-relay": [],
                "relay": [],
                "drainer": [],
                "queue": [],
            }
            relay_round(messages(200), args.concurrency)  # warm: connections, channel
            client_round(messages(200), topic, ordered)
            for _ in range(args.rounds):
                for batches in ("default", "relay"):
                    specs = messages(args.messages)
                    took = client_round(specs, topic, ordered, batches)
                    rates[f"client-{batches}"].append(args.messages / took)
                specs = messages(args.messages)
                rates["relay"].append(args.messages / relay_round(specs, args.concurrency))
                specs = messages(args.messages)
                rates["drainer"].append(args.messages / drainer_round(specs, topic, ordered))
                specs = messages(args.messages)
                rates["queue"].append(args.messages / queue_round(specs, args.concurrency))
            counted[shape] = counted_round(messages(args.messages), args.concurrency)
            relay.ordering_fields = real
            results[shape] = rates
    summary = {}
    for shape, r in results.items():
        medians = {name: statistics.median(v) for name, v in r.items()}
        client = max(medians["client-default"], medians["client-relay"])  # the better peer
        summary[shape] = {
            "client_per_s": client,
            "client_default_per_s": medians["client-default"],
            "client_relay_batches_per_s": medians["client-relay"],
            "relay_per_s": medians["relay"],
            "drainer_per_s": medians["drainer"],
            "relay_to_drainer": medians["relay"] / medians["drainer"],
            "queue_per_s": medians["queue"],
            "ratio": medians["relay"] / client,
            "per_message": counted[shape],
            "redelivered": sum(REDELIVERED),
            "rounds": r,
        }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    where = args.ds or ("PostgreSQL" if args.postgres else "SQLite")
    print(
        f"{args.messages} messages a round, {args.rounds} rounds, relay --concurrency "
        f"{args.concurrency}, RELAY_BATCH_SIZE {args.batch}, queue on {where}; "
        f"{platform.python_version()}, {os.cpu_count()} cores"
    )
    for shape, s in summary.items():
        verdict = "meets" if s["ratio"] >= GOAL else "MISSES"
        print(
            f"{shape:<10} client {s['client_per_s']:8.0f}/s (default batches "
            f"{s['client_default_per_s']:.0f}/s, the relay's {s['client_relay_batches_per_s']:.0f}"
            f"/s)   relay {s['relay_per_s']:8.0f}/s   relay/client {s['ratio']:.0%} ({verdict} "
            f"the {GOAL:.0%} goal); receive+ack alone {s['queue_per_s']:8.0f}/s (relay/that "
            f"{s['relay_per_s'] / s['queue_per_s']:.0%})"
        )
        print(
            f"{'':<10} hand-written drainer {s['drainer_per_s']:8.0f}/s   relay/drainer "
            f"{s['relay_to_drainer']:.2f} (goal {DRAINER_GOAL:.1f})"
        )
        print(f"{'':<10} per message: {s['per_message']}")
    if any(REDELIVERED):
        print(f"deliveries whose lease ran out before their ack (published again): {REDELIVERED}")


if __name__ == "__main__":
    main()

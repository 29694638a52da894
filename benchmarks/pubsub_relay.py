"""The Pub/Sub relay's throughput against Google's client publishing alone, in one run, on one
Pub/Sub emulator.

    .venv/bin/python benchmarks/pubsub_relay.py                      # 5000 messages a round
    .venv/bin/python benchmarks/pubsub_relay.py --messages 20000 --concurrency 4 --json

Each round, alternating so that drift hits both alike:

- ``client``: a ``PublisherClient`` configured as the relay's (message ordering on, no client
  retry) publishes N messages with the relay's attributes and ordering keys (the payloads and
  keys of the queue's messages), then waits for every confirmation: the rate the bus takes;
- ``relay``: the same N messages sent to ``pubsubapp.OrderEvents`` (SQLite, WAL, as in
  tests/settings.py) are relayed by a ``Worker`` in this process (``--burst``, ``--concurrency``
  threads, batches of ``RELAY_BATCH_SIZE``): receive, publish, wait, ack, from the first receive
  to the empty queue.

- ``queue``, for where the relay is bounded: the same worker with a receiver that publishes
  nothing (receive and ack alone): the queue's own ceiling on this database.

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
ORDERS = 50


def configure(workdir: str, batch: int) -> None:
    sys.path.insert(0, str(ROOT))
    from django.conf import settings

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
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": os.path.join(workdir, "bench.sqlite3"),
                "OPTIONS": {
                    "init_command": "PRAGMA journal_mode=WAL;",
                    "transaction_mode": "IMMEDIATE",
                    "timeout": 20,
                },
                "CONN_MAX_AGE": None,
            }
        },
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


def client_round(specs: list[dict[str, Any]], topic: str, ordered: bool) -> float:
    """Seconds Google's client takes to publish the messages and get every confirmation."""
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
    client = PublisherClient(publisher_options=types.PublisherOptions(enable_message_ordering=True))
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


def queue_round(specs: list[dict[str, Any]], concurrency: int) -> float:
    """``relay_round`` with a receiver that publishes nothing: receive and ack alone."""
    import dataclasses

    from spanner_queues.receivers import receivers

    [spec] = [s for s in receivers.all() if ".relay[" in s.name]
    receivers.register(dataclasses.replace(spec, func=lambda context, messages: None))
    try:
        return relay_round(specs, concurrency)
    finally:
        receivers.register(spec)


def relay_round(specs: list[dict[str, Any]], concurrency: int) -> float:
    """Seconds the relay takes to publish and ack the messages, first receive to empty queue."""
    from spanner_queues.worker import Worker
    from tests.pubsubapp.models import OrderEvents

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
    assert stats.processed == len(specs) and not OrderEvents.objects.exists(), stats
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500, help="RELAY_BATCH_SIZE")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from spanner_queues.testing.pubsub import PubSubEmulator

    with tempfile.TemporaryDirectory() as workdir, PubSubEmulator() as emulator:
        os.environ.update(emulator.env)
        configure(workdir, args.batch)
        from django.core.management import call_command
        from google.cloud.pubsub_v1 import PublisherClient

        from spanner_queues.contrib.pubsub import relay

        call_command("migrate", verbosity=0)
        topic = "projects/sq-bench/topics/orders"
        PublisherClient().create_topic(name=topic)
        results: dict[str, dict[str, list[float]]] = {}
        for shape in ("keyed", "unordered"):
            ordered = shape == "keyed"
            real = relay.ordering_fields
            if not ordered:
                relay.ordering_fields = lambda model: ()  # type: ignore[assignment]
            rates: dict[str, list[float]] = {"client": [], "relay": [], "queue": []}
            relay_round(messages(200), args.concurrency)  # warm: connections, channel
            client_round(messages(200), topic, ordered)
            for _ in range(args.rounds):
                specs = messages(args.messages)
                rates["client"].append(args.messages / client_round(specs, topic, ordered))
                specs = messages(args.messages)
                rates["relay"].append(args.messages / relay_round(specs, args.concurrency))
                specs = messages(args.messages)
                rates["queue"].append(args.messages / queue_round(specs, args.concurrency))
            relay.ordering_fields = real
            results[shape] = rates
    summary = {
        shape: {
            "client_per_s": statistics.median(r["client"]),
            "relay_per_s": statistics.median(r["relay"]),
            "queue_per_s": statistics.median(r["queue"]),
            "ratio": statistics.median(r["relay"]) / statistics.median(r["client"]),
            "rounds": r,
        }
        for shape, r in results.items()
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(
        f"{args.messages} messages a round, {args.rounds} rounds, relay --concurrency "
        f"{args.concurrency}, RELAY_BATCH_SIZE {args.batch}; {platform.python_version()}, "
        f"{os.cpu_count()} cores"
    )
    for shape, s in summary.items():
        verdict = "meets" if s["ratio"] >= GOAL else "MISSES"
        print(
            f"{shape:<10} client {s['client_per_s']:8.0f}/s   relay {s['relay_per_s']:8.0f}/s   "
            f"relay/client {s['ratio']:.0%} ({verdict} the {GOAL:.0%} goal); receive+ack alone "
            f"{s['queue_per_s']:8.0f}/s (relay/that {s['relay_per_s'] / s['queue_per_s']:.0%})"
        )


if __name__ == "__main__":
    main()

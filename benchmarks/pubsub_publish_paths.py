"""What publishing costs this process: Google's ``PublisherClient.publish`` (the relay's
settings) against raw ``Publish`` requests built from protobufs, in one run, on one Pub/Sub
emulator (issue 39: where the relay's time would come from).

    .venv/bin/python benchmarks/pubsub_publish_paths.py [--messages 10000] [--rounds 3]

Each round, alternating, publishes the same N messages (the relay's three attributes, 50
ordering keys interleaved as a claim returns them, or none) and waits for every confirmation:

- ``client``: ``PublisherClient.publish`` per message, batches of up to 1,000 and ordering on,
  no client retry (as the relay published before ``spanner_queues.contrib.pubsub.publish``);
- ``raw``: one ``PublishRequest`` per 500 messages of raw protobufs (``PubsubMessage.pb()``),
  sent on the client's own gRPC channel with the topic's routing header, all requests in flight
  at once (each key's messages stay in request order; the requests of one key would have to go
  one after the other for Pub/Sub's order across them).

Prints the rate and this process's CPU a message (``time.process_time``: every thread of it,
the client's batch threads included) for each. The emulator's wall clock is shared by both;
the CPU is what the relay's thread would pay."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ORDERS = 50
REQUEST_SIZE = 500


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from spanner_queues.testing.pubsub import PubSubEmulator

    with PubSubEmulator() as emulator:
        os.environ.update(emulator.env)
        run(args.messages, args.rounds)


def run(n: int, rounds: int) -> None:
    from google.cloud.pubsub_v1 import PublisherClient, types
    from google.pubsub_v1.types import pubsub

    options = types.PublisherOptions(enable_message_ordering=True)
    client = PublisherClient(
        batch_settings=types.BatchSettings(max_messages=1000), publisher_options=options
    )
    topic = "projects/sq-bench/topics/publish-paths"
    client.create_topic(name=topic)
    messages = [
        (b'{"n":%d}' % i, str(i % ORDERS), {"event_id": f"e{i}", "queue": "q", "key": f"[{i}]"})
        for i in range(n)
    ]
    message_pb, request_pb = pubsub.PubsubMessage.pb(), pubsub.PublishRequest.pb()
    publish = client._transport.grpc_channel.unary_unary(
        "/google.pubsub.v1.Publisher/Publish",
        request_serializer=request_pb.SerializeToString,
        response_deserializer=pubsub.PublishResponse.pb().FromString,
    )
    routing = [("x-goog-request-params", f"topic={topic}")]

    def by_client(keyed: bool) -> None:
        futures = [
            client.publish(topic, data, ordering_key=key if keyed else "", retry=None, **attrs)
            for data, key, attrs in messages
        ]
        for future in futures:
            future.result(60)

    def raw(keyed: bool) -> None:
        calls: list[Any] = []
        for start in range(0, n, REQUEST_SIZE):
            batch = messages[start : start + REQUEST_SIZE]
            request = request_pb(
                topic=topic,
                messages=[
                    message_pb(data=data, ordering_key=key if keyed else "", attributes=attrs)
                    for data, key, attrs in batch
                ],
            )
            calls.append(publish.future(request, timeout=60, metadata=routing))
        assert sum(len(call.result().message_ids) for call in calls) == n

    print(f"{n} messages a round, {rounds} rounds; Python {sys.version.split()[0]}")
    for keyed in (False, True):
        shape = "keyed" if keyed else "unordered"
        for r in range(rounds):
            figures = []
            for name, fn in (("client", by_client), ("raw", raw)):
                wall, cpu = time.perf_counter(), time.process_time()
                fn(keyed)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                figures.append(f"{name} {n / wall:7.0f}/s, {cpu / n * 1e6:6.1f} us CPU a message")
            print(f"{shape:<9} round {r + 1}: " + " | ".join(figures), flush=True)
    client.stop()


if __name__ == "__main__":
    main()

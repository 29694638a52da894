"""The relay, in this process against the Pub/Sub emulator: a relayed queue's messages reach
its topic with their payload, queue, key and a stable event id, and leave the queue only once
Pub/Sub confirmed them; a message Pub/Sub refuses is dead-lettered (not retried for ever); a
failing Pub/Sub gives the messages back, and they are published once it works again."""

from __future__ import annotations

import itertools
import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from google.cloud import pubsub_v1

from spanner_queues import api
from spanner_queues.contrib.pubsub import relay as relay_module
from spanner_queues.contrib.pubsub.relay import PublishFailed, event_id
from spanner_queues.signals import messages_published, publish_failed
from spanner_queues.worker import Worker, WorkerEvents
from tests.conftest import wait_until
from tests.pubsubapp.models import Order, OrderEvents, OrderEventsDead
from tests.tracingapp.models import Events

pytestmark = pytest.mark.django_db(transaction=True)


def relay_burst(events: WorkerEvents | None = None) -> Any:
    """One burst of a relay worker: everything due is published (or given back)."""
    return Worker(
        ["pubsubapp.OrderEvents"],
        burst=True,
        install_signal_handlers=False,
        listeners=[events] if events is not None else [],
    ).run()


def published_messages() -> Any:
    """A context collecting the ``Message``s ``messages_published`` reports."""

    class Collect:
        def __init__(self) -> None:
            self.messages: list[Any] = []

        def __call__(self, sender: Any, messages: Any, **kwargs: Any) -> None:
            self.messages.extend(messages)

        def __enter__(self) -> list[Any]:
            messages_published.connect(self, dispatch_uid="test-published")
            return self.messages

        def __exit__(self, *exc: object) -> None:
            messages_published.disconnect(dispatch_uid="test-published")

    return Collect()


def test_a_relayed_message_reaches_the_topic_with_its_payload_key_and_event_id(pubsub) -> None:
    with transaction.atomic():
        order = Order.objects.create(amount=5)
    with published_messages() as confirmed:
        stats = relay_burst()
    assert stats.processed == 1
    assert not OrderEvents.objects.exists()
    [sent] = confirmed
    [published] = pubsub.pull()
    assert json.loads(published.data)["pk"] == order.pk
    assert published.data == sent.payload  # the stored payload bytes: JSON text
    assert published.attributes["queue"] == "pubsubapp.OrderEvents"
    assert json.loads(published.attributes["key"]) == list(sent.key)
    assert published.attributes["event_id"] == event_id(sent)
    assert published.ordering_key == str(order.pk)  # the key fields but the last


def test_the_event_id_is_the_same_on_every_delivery_of_one_sent_message(pubsub) -> None:
    """A relay that dies between the publish and the ack publishes the message again: the
    copy carries the same event id (what the inbox deduplicates on)."""
    OrderEvents.send(order=1, message_id="m1", payload={"n": 1})
    first = api.receive(OrderEvents, max_messages=1, lease=timedelta(seconds=1))[0]
    # its lease expires unacked (a relay killed after the publish): delivered again
    again = wait_until(lambda: api.receive(OrderEvents, max_messages=1), 60)[0]
    assert again.lease_token != first.lease_token
    assert event_id(first) == event_id(again)
    api.ack(again)
    other = OrderEvents.send(order=1, message_id="m2", payload={"n": 1})
    assert event_id(other) != event_id(first)


def test_one_relay_run_publishes_each_ordering_keys_messages_together_in_their_order(
    pubsub, monkeypatch
) -> None:
    """Messages of several ordering keys come interleaved from a claim; the relay publishes
    each key's together (in their order) in each run, so the client fills one batch per key
    per run instead of a publish request every few messages (``benchmarks/pubsub_relay.py``).
    A run ends on its thread with ``messages_published``."""
    client = relay_module.publisher()
    runs: dict[tuple[int, int], list[tuple[str, str]]] = {}
    ended: dict[int, int] = {}
    real = client.publish

    def recording(topic: str, data: bytes, ordering_key: str = "", **kwargs: Any) -> Any:
        thread = threading.get_ident()
        run = runs.setdefault((thread, ended.get(thread, 0)), [])
        run.append((ordering_key, json.loads(kwargs["key"])[1]))
        return real(topic, data, ordering_key=ordering_key, **kwargs)

    def run_ended(sender: Any, **kwargs: Any) -> None:
        thread = threading.get_ident()
        ended[thread] = ended.get(thread, 0) + 1

    monkeypatch.setattr(client, "publish", recording)
    messages_published.connect(run_ended, dispatch_uid="test-run-ended")
    try:
        for i in range(12):  # one by one: each later than the last, claimed in this order
            OrderEvents.send(order=i % 3, message_id=f"m{i:02d}", payload={"n": i})
        assert relay_burst().processed == 12
    finally:
        messages_published.disconnect(dispatch_uid="test-run-ended")
    assert sum(len(run) for run in runs.values()) == 12
    assert any(len({key for key, _ in run}) > 1 for run in runs.values())  # keys interleaved
    for run in runs.values():
        keys = [key for key, _ in run]
        changes = sum(a != b for a, b in itertools.pairwise(keys))
        assert changes == len(set(keys)) - 1, run  # each key's messages together
        for key in set(keys):
            ids = [m for k, m in run if k == key]
            assert ids == sorted(ids), run  # in their order
    got: list[Any] = []
    assert wait_until(lambda: got.extend(pubsub.pull()) or len(got) >= 12, 30)
    assert len(got) == 12


def test_a_message_pubsub_refuses_is_dead_lettered_and_the_others_published(pubsub) -> None:
    refused_messages: list[Any] = []

    def on_failed(sender: Any, messages: Any, refused: bool, **kwargs: Any) -> None:
        if refused:
            refused_messages.extend(messages)

    publish_failed.connect(on_failed, dispatch_uid="test-refused")
    try:
        OrderEvents.send(order=1, message_id="ok", payload={"n": 1})
        # a key whose "key" attribute is over Pub/Sub's 1024 bytes of an attribute value
        OrderEvents.send(order=2, message_id="k" * 1100, payload={"n": 2})
        stats = relay_burst()
    finally:
        publish_failed.disconnect(dispatch_uid="test-refused")
    assert stats.processed == 2 and stats.failed == 0
    assert not OrderEvents.objects.exists()
    assert list(OrderEventsDead.objects.values_list("order", flat=True)) == [2]
    assert [m.key[0] for m in refused_messages] == [2]
    assert [json.loads(m.data) for m in pubsub.pull()] == [{"n": 1}]


def test_a_failing_pubsub_gives_the_messages_back_and_resumed_keys_publish_them_later(
    pubsub,
) -> None:
    publisher = pubsub_v1.PublisherClient()
    publisher.delete_topic(topic=pubsub.topic)  # Pub/Sub answers NOT_FOUND: a failing bus
    events = WorkerEvents()
    for i in range(3):
        OrderEvents.send(order=i, message_id=f"m{i}", payload={"n": i})
    stats = relay_burst(events)
    assert stats.failed >= 3 and stats.processed == 0  # (more: retried within the burst)
    assert OrderEvents.objects.count() == 3, "a message left its queue unpublished"
    failures = [e.error for e in events.history if e.name == "failed"]
    assert failures and all(isinstance(e, PublishFailed) for e in failures)

    publisher.create_topic(name=pubsub.topic)
    subscriber = pubsub_v1.SubscriberClient()
    subscriber.delete_subscription(subscription=pubsub.subscription)  # (detached from the old)
    subscriber.create_subscription(
        request={
            "name": pubsub.subscription,
            "topic": pubsub.topic,
            "enable_message_ordering": True,
        }
    )
    with published_messages() as published:
        wait_until(lambda: relay_burst() is not None and not OrderEvents.objects.exists(), 60)
    assert sorted(m.key[0] for m in published) == [0, 1, 2]
    assert sorted(json.loads(m.data)["n"] for m in pubsub.pull()) == [0, 1, 2]


@pytest.mark.django_db
def test_an_envelope_queues_event_id_is_its_cloudevent_id_and_the_event_is_published() -> None:
    first = Events.send(id="same", payload={"n": 1})
    api.ack_many(Events, [{"id": "same"}])
    second = Events.send(id="same", payload={"n": 1})  # the same key and payload, sent again
    assert first.event is not None and second.event is not None
    assert event_id(first) == first.event["id"] and event_id(second) == second.event["id"]
    assert event_id(first) != event_id(second)  # two sends, two events
    assert json.loads(second.stored_payload)["data"] == {"n": 1}  # what the relay publishes

"""The relay, in this process against the Pub/Sub emulator: a relayed queue's messages reach
its topic with their payload, queue, key and a stable event id, and leave the queue only once
Pub/Sub confirmed them; a message Pub/Sub refuses is dead-lettered (not retried for ever); a
failing Pub/Sub gives the messages back, and they are published once it works again."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from google.api_core import exceptions as google_exceptions
from google.cloud import pubsub_v1

from spanner_queues import api
from spanner_queues.contrib.pubsub import relay as relay_module
from spanner_queues.contrib.pubsub.inbox import InboxPuller
from spanner_queues.contrib.pubsub.publish import Outgoing, Publisher
from spanner_queues.contrib.pubsub.relay import event_id
from spanner_queues.message import Message
from spanner_queues.signals import messages_published, publish_failed
from spanner_queues.worker import Worker, WorkerEvents
from tests.conftest import wait_until
from tests.pubsubapp.models import (
    BillingInbox,
    Order,
    OrderedOrderEvents,
    OrderEvents,
    OrderEventsDead,
)
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


def test_paid_refunded_paid_under_one_key_reaches_the_inbox_as_three_events(pubsub) -> None:
    """One event per send (issue 39): the same key and the same payload sent again after the
    first was relayed is another event, and the consumer takes in all three (a digest of the
    key and payload made the second "paid" a copy of the first, dropped silently)."""
    subscriber = pubsub_v1.SubscriberClient()
    inbox = InboxPuller(BillingInbox)
    ids = []
    for status in ("paid", "refunded", "paid"):
        with published_messages() as confirmed:
            OrderEvents.send(order=7, message_id="order-7", payload={"status": status})
            assert relay_burst().processed == 1
        ids.append(event_id(confirmed[0]))
    assert len(set(ids)) == 3
    try:
        wait_until(lambda: inbox.pull_once(subscriber) >= 0 and inbox.taken_in >= 3, 60)
    finally:
        subscriber.close()
    assert inbox.taken_in == 3
    received = api.receive(BillingInbox, max_messages=10)
    assert sorted(m.key[0] for m in received) == sorted(ids)
    assert sorted(m.json()["status"] for m in received) == ["paid", "paid", "refunded"]


def test_a_relayed_queue_stores_each_send_as_an_event_and_publishes_its_data(pubsub) -> None:
    """Each send's id is made in the send and kept by the stored message (a ``Retry`` re-sends
    the same bytes); the topic gets the payload, as before, not the envelope."""
    sent = OrderEvents.send(order=1, message_id="m1", payload={"n": 1})
    assert sent.event is not None and event_id(sent) == sent.event["id"]
    assert json.loads(sent.stored_payload)["data"] == {"n": 1}
    assert relay_burst().processed == 1
    [published] = pubsub.pull()
    assert json.loads(published.data) == {"n": 1}
    assert published.attributes["event_id"] == sent.event["id"]


def test_one_relay_run_publishes_each_ordering_keys_messages_together_in_their_order(
    pubsub, monkeypatch
) -> None:
    """Messages of several ordering keys come interleaved from a claim; a run publishes them in
    one request, each key's messages together and in their order (``Publisher``). A run ends
    on its thread with ``messages_published``."""
    requests: list[list[tuple[str, str]]] = []
    runs = 0
    real = Publisher._send

    def recording(self: Publisher, request: Any, deadline: float) -> Any:
        requests.append(
            [(m.ordering_key, json.loads(m.attributes["key"])[1]) for m in request.messages]
        )
        return real(self, request, deadline)

    def run_ended(sender: Any, **kwargs: Any) -> None:
        nonlocal runs
        runs += 1

    monkeypatch.setattr(Publisher, "_send", recording)
    messages_published.connect(run_ended, dispatch_uid="test-run-ended")
    try:
        for i in range(12):  # one by one: each later than the last, claimed in this order
            OrderEvents.send(order=i % 3, message_id=f"m{i:02d}", payload={"n": i})
        assert relay_burst().processed == 12
    finally:
        messages_published.disconnect(dispatch_uid="test-run-ended")
    assert sum(len(request) for request in requests) == 12
    assert len(requests) == runs  # one request a run
    for request in requests:
        keys = [key for key, _ in request]
        changes = sum(a != b for a, b in itertools.pairwise(keys))
        assert changes == len(set(keys)) - 1, request  # each key's messages together
        for key in set(keys):
            ids = [m for k, m in request if k == key]
            assert ids == sorted(ids), request  # in their order
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


def test_a_message_the_relay_cannot_build_is_dead_lettered_and_the_others_published(
    pubsub, monkeypatch
) -> None:
    # a stored value it cannot encode for publishing: that message's fault, not the run's
    # (an error out of the run would charge every message of the batch an attempt)
    real = relay_module.published_data

    def failing(message: Message) -> bytes:
        if message.key[0] == 2:
            raise ValueError("not encodable")
        return real(message)

    monkeypatch.setattr(relay_module, "published_data", failing)
    OrderEvents.send(order=1, message_id="ok", payload={"n": 1})
    OrderEvents.send(order=2, message_id="bad", payload={"n": 2})
    stats = relay_burst()
    assert stats.processed == 2 and stats.failed == 0
    assert list(OrderEventsDead.objects.values_list("order", flat=True)) == [2]
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
    # sent again after the queue's back-off, no attempt spent (a burst may meet them again:
    # on native queues, once the back-off has passed)
    assert stats.retried >= 3 and stats.failed == 0 and stats.processed == 0
    assert OrderEvents.objects.count() == 3, "a message left its queue unpublished"
    assert not [e for e in events.history if e.name == "failed"]

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


def test_an_ordered_queues_events_reach_the_topic_in_send_order_through_a_failing_pubsub(
    pubsub,
) -> None:
    """``QueueMeta.ordered_by``: the relay is handed an order's next event only once the one
    before was published, so while Pub/Sub fails only each order's first event is tried, and
    once it works again each order's events are published, and pulled under its ordering key,
    in send order."""
    publisher = pubsub_v1.PublisherClient()
    publisher.delete_topic(topic=pubsub.topic)  # Pub/Sub answers NOT_FOUND: a failing bus
    for n in range(4):
        for order in (7, 8):  # message ids against the send order
            OrderedOrderEvents.send(order=order, message_id=f"m{9 - n}", payload={"n": n})

    def relay(events: WorkerEvents | None = None) -> Any:
        return Worker(
            ["pubsubapp.OrderedOrderEvents"],
            burst=True,
            install_signal_handlers=False,
            listeners=[events] if events is not None else [],
        ).run()

    events = WorkerEvents()
    with published_messages() as published:
        relay(events)
        assert published == []
        tried = {m.json()["n"] for m in events.messages("retried")}
        assert tried == {0}, "a later event of an order was tried while its first failed"
        assert OrderedOrderEvents.objects.count() == 8
        publisher.create_topic(name=pubsub.topic)
        subscriber = pubsub_v1.SubscriberClient()
        subscriber.delete_subscription(subscription=pubsub.subscription)
        subscriber.create_subscription(
            request={
                "name": pubsub.subscription,
                "topic": pubsub.topic,
                "enable_message_ordering": True,
            }
        )
        wait_until(lambda: relay() is not None and not OrderedOrderEvents.objects.exists(), 60)
    for order in (7, 8):
        sent = [m.json()["n"] for m in published if m.key[0] == order]
        assert sent == [0, 1, 2, 3], sent
    pulled: dict[str, list[int]] = {}

    def all_pulled() -> bool:
        for m in pubsub.pull():
            pulled.setdefault(m.ordering_key, []).append(json.loads(m.data)["n"])
        return sum(map(len, pulled.values())) >= 8

    wait_until(all_pulled, 30)
    assert pulled == {"7": [0, 1, 2, 3], "8": [0, 1, 2, 3]}


@pytest.mark.django_db
def test_an_envelope_queues_event_id_is_its_cloudevent_id_and_the_event_is_published() -> None:
    first = Events.send(id="same", payload={"n": 1})
    api.ack_many(Events, [{"id": "same"}])
    second = Events.send(id="same", payload={"n": 1})  # the same key and payload, sent again
    assert first.event is not None and second.event is not None
    assert event_id(first) == first.event["id"] and event_id(second) == second.event["id"]
    assert event_id(first) != event_id(second)  # two sends, two events
    assert json.loads(second.stored_payload)["data"] == {"n": 1}  # what the relay publishes


def declared_topic(monkeypatch: Any, topic: str) -> None:
    """OrderEvents relays to ``topic`` (its declaration read by the relay at each run)."""
    real = relay_module.queue_options

    def fake(model: Any) -> Any:
        options = real(model)
        return dataclasses.replace(options, pubsub_topic=topic) if model is OrderEvents else options

    monkeypatch.setattr(relay_module, "queue_options", fake)


def test_a_topic_pubsub_refuses_every_publish_to_fails_the_queue_not_its_messages(
    pubsub, monkeypatch
) -> None:
    # Pub/Sub answers INVALID_ARGUMENT for the whole publish: before, every message was
    # dead-lettered as if Pub/Sub had refused it, and never retried
    declared_topic(monkeypatch, "orders!")
    events = WorkerEvents()
    for i in range(3):
        OrderEvents.send(order=i, message_id=f"m{i}", payload={"n": i})
    stats = relay_burst(events)
    assert not OrderEventsDead.objects.exists(), "a message was charged the topic's refusal"
    assert OrderEvents.objects.count() == 3
    assert stats.failed == 0 and stats.processed == 0
    retried = [e for e in events.history if e.name == "retried"]
    assert len(retried) >= 3  # sent again after the queue's back-off, no attempt spent
    episode = relay_module._episodes["pubsubapp.OrderEvents"]
    assert episode.runs >= 1 and episode.retry_at > 0


class _AlonePublisher:
    """A ``Publisher`` that takes one message at a time and answers by its data."""

    def __init__(self, answer: Callable[[bytes], BaseException | None]) -> None:
        self.answer = answer
        self.alone: list[bytes] = []

    def publish(self, batch: list[Outgoing], deadline: float) -> list[Any]:
        [out] = batch
        self.alone.append(out.data)
        return [self.answer(out.data)]


def _sort_suspects(
    client: Any, suspects: list[Any], outgoing: list[Any]
) -> tuple[list[Any], list[Any], list[Any]]:
    """``relay._sort_suspects`` of ``suspects``: (confirmed, refused, failed)."""
    confirmed: list[Any] = []
    refused: list[Any] = []
    failed: list[Any] = []
    relay_module._sort_suspects(
        client, time.monotonic() + 30, OrderEvents, suspects, outgoing, confirmed, refused, failed
    )
    return confirmed, refused, failed


def _suspects(payloads: list[bytes], keys: list[str]) -> tuple[list[Any], list[Any]]:
    """Messages of ``payloads`` under the ordering ``keys``, all refused in their request:
    (suspects, outgoing)."""
    messages = [_message(i, data) for i, data in enumerate(payloads)]
    outgoing: list[Any] = [
        Outgoing("t", m.stored_payload, key, {}) for m, key in zip(messages, keys, strict=True)
    ]
    refusal = google_exceptions.InvalidArgument("request")
    return [(m, i, refusal) for i, m in enumerate(messages)], outgoing


def test_a_message_pubsub_refuses_alone_is_dead_lettered_once_another_got_through() -> None:
    # one poison message makes Pub/Sub refuse its whole request: each refused message is
    # published again alone, and only the one refused alone is the message's fault
    client = _AlonePublisher(
        lambda data: google_exceptions.InvalidArgument("schema") if data == b"poison" else None
    )
    suspects, outgoing = _suspects([b"poison", b"a", b"b"], ["", "", ""])
    confirmed, refused, failed = _sort_suspects(client, suspects, outgoing)
    assert client.alone == [b"poison", b"a", b"b"]
    assert [m.stored_payload for m in confirmed] == [b"a", b"b"]
    assert [m.stored_payload for m, _ in refused] == [b"poison"]
    assert failed == []
    everything_refused = [s for s in suspects if s[0].stored_payload == b"poison"] * 9
    confirmed, refused, failed = _sort_suspects(client, everything_refused, outgoing)
    assert confirmed == [] and refused == [] and len(failed) == 9  # the topic's: given back


def test_a_suspect_after_a_failed_one_of_its_key_is_given_back_untried() -> None:
    # sorting suspects alone must not publish a key's later message once an earlier one of
    # the key failed (its order would break): given back, with the failed one
    client = _AlonePublisher(
        lambda data: google_exceptions.ServiceUnavailable("down") if data == b"a1" else None
    )
    suspects, outgoing = _suspects([b"a1", b"a2", b"b1"], ["a", "a", "b"])
    confirmed, refused, failed = _sort_suspects(client, suspects, outgoing)
    assert client.alone == [b"a1", b"b1"]
    assert [m.stored_payload for m in confirmed] == [b"b1"]
    assert sorted(m.stored_payload for m, _, _ in failed) == [b"a1", b"a2"]
    assert refused == []


def _message(i: int, data: bytes) -> Message:
    return Message(
        queue="pubsubapp.OrderEvents",
        key=(i, f"m{i}"),
        key_names=("order", "message_id"),
        payload=data,
        deliver_time=None,
    )


@pytest.fixture
def stalled_pubsub(monkeypatch: Any) -> Any:
    """A Pub/Sub that never answers: a port whose connections are never served (the relay's
    publisher is made anew against it)."""
    hole = socket.create_server(("127.0.0.1", 0), backlog=64)
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{hole.getsockname()[1]}")
    monkeypatch.setattr(relay_module, "_publisher", None)
    yield hole
    publisher = relay_module._publisher
    if publisher is not None:
        publisher.close()
    hole.close()


def test_a_stalled_pubsub_under_a_shorter_time_limit_gives_the_batch_back_unspent(
    pubsub, stalled_pubsub
) -> None:
    # before: the relay waited PUBLISH_TIMEOUT_SECONDS (60) past the worker's 2 s limit, the
    # interrupt could not reach it, the worker stopped as stuck (runqueueworker: exit 3), and
    # each message was charged a failed attempt
    events = WorkerEvents()
    for i in range(3):
        OrderEvents.send(order=i, message_id=f"m{i}", payload={"n": i})
    stats = Worker(
        ["pubsubapp.OrderEvents"],
        burst=True,
        timeout=2,
        stuck_grace=5,
        install_signal_handlers=False,
        listeners=[events],
    ).run()
    assert stats.timed_out == 0 and stats.failed == 0
    assert stats.retried >= 3  # given back within the limit, no attempt spent
    assert OrderEvents.objects.count() == 3


def test_an_outage_logs_one_traceback_per_episode_not_one_per_message(
    pubsub, caplog: pytest.LogCaptureFixture
) -> None:
    # before: one ERROR with its full traceback per message per failed run (14 s of outage:
    # 13.7 MB, 1,606 tracebacks)
    publisher = pubsub_v1.PublisherClient()
    publisher.delete_topic(topic=pubsub.topic)
    for i in range(20):
        OrderEvents.send(order=i, message_id=f"m{i}", payload={"n": i})
    caplog.set_level(logging.INFO, logger="spanner_queues")
    events = WorkerEvents()
    worker = Worker(
        ["pubsubapp.OrderEvents"],
        install_signal_handlers=False,
        poll_interval=0.1,
        listeners=[events],
    )
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:  # three rounds of the 20 messages, each not published
        wait_until(lambda: events.counts["failed"] + events.counts["retried"] >= 60, 60)
    finally:
        worker.stop()
        runner.join(60)
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert len(tracebacks) == 1, f"{len(tracebacks)} tracebacks"  # the episode's one
    assert tracebacks[0].name == "spanner_queues.pubsub"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    retried = [r for r in caplog.records if getattr(r, "action", None) == "retried"]
    assert len(retried) == events.counts["retried"]  # a line each
    episode = relay_module._episodes["pubsubapp.OrderEvents"]
    assert episode.given_back == events.counts["retried"]  # counted in the episode


def test_a_key_whose_run_stopped_waiting_is_published_by_the_next_run(
    pubsub, pubsub_emulator, monkeypatch: Any
) -> None:
    """Pub/Sub stalls (the emulator stopped) past a run's wait: the run's message is not
    confirmed, and once Pub/Sub answers again the next run of its key reaches it at once (with
    Google's client, the key stayed paused by the stalled publish's late failure, and the next
    run failed without reaching Pub/Sub: one more failed run after every such outage)."""
    monkeypatch.setattr(relay_module, "_publisher", None)  # a publisher of this test's own
    publisher = relay_module.publisher()
    out = Outgoing(pubsub.topic, b'{"n": 1}', "1", {"event_id": "e1"})
    os.killpg(pubsub_emulator.proc.pid, signal.SIGSTOP)
    try:
        [error] = publisher.publish([out], time.monotonic() + 0.5)
        assert isinstance(error, google_exceptions.DeadlineExceeded)
    finally:
        pubsub_emulator.resume()
    try:
        assert publisher.publish([out], time.monotonic() + 30) == [None]
    finally:
        publisher.close()

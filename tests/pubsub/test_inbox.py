"""The inbox, in this process against the Pub/Sub emulator: each pulled event is written once
into the inbox queue, keyed by its event id, with its seen row; a copy of an event already
handled (its inbox message acked and gone) is dropped; data the queue cannot hold is not acked;
seen ids past the window are pruned. An ordered inbox keys each event by its Pub/Sub ordering
key too, and its receiver runs each key's events in publish order."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext
from google.cloud import pubsub_v1

from spanner_queues import clock
from spanner_queues.contrib.pubsub.inbox import InboxPuller, prune
from spanner_queues.contrib.pubsub.models import SeenEvent, seen_id
from spanner_queues.engines import engine_for
from spanner_queues.message import Message
from spanner_queues.receivers import ReceiverRegistry
from spanner_queues.receivers import receiver as register_receiver
from spanner_queues.signals import inbox_duplicates_dropped
from spanner_queues.worker import Worker
from tests.conftest import wait_until
from tests.pubsubapp.models import BillingInbox, Charge, OrderedBillingInbox, WideKeyQueue

pytestmark = pytest.mark.django_db(transaction=True)


def publish(pubsub: Any, data: bytes, **attributes: str) -> str:
    publisher = pubsub_v1.PublisherClient()
    return publisher.publish(pubsub.topic, data, **attributes).result(30)


def pull_until(puller: InboxPuller, subscriber: Any, done: Any) -> None:
    wait_until(lambda: puller.pull_once(subscriber) >= 0 and done(), 60)


def run_inbox() -> Any:
    return Worker(["pubsubapp.BillingInbox"], burst=True, install_signal_handlers=False).run()


@pytest.fixture
def puller(pubsub: Any) -> Any:
    subscriber = pubsub_v1.SubscriberClient()
    yield InboxPuller(BillingInbox), subscriber
    subscriber.close()


def test_each_event_is_taken_in_once_keyed_by_its_event_id(pubsub, puller) -> None:
    inbox, subscriber = puller
    for i in range(3):
        publish(pubsub, json.dumps({"pk": i}).encode(), event_id=f"e{i}")
    pull_until(inbox, subscriber, lambda: inbox.taken_in == 3)
    assert sorted(BillingInbox.objects.values_list("event_id", flat=True)) == ["e0", "e1", "e2"]
    assert SeenEvent.objects.filter(inbox="pubsubapp.BillingInbox").count() == 3
    assert SeenEvent.objects.filter(pk=seen_id("pubsubapp.BillingInbox", "e1")).exists()
    assert run_inbox().processed == 3
    assert sorted(Charge.objects.values_list("order_pk", flat=True)) == [0, 1, 2]
    assert inbox.pull_once(subscriber) == 0, "a taken-in message was not acked to Pub/Sub"


def test_a_copy_of_an_already_handled_event_is_dropped(pubsub, puller) -> None:
    inbox, subscriber = puller
    dropped: list[int] = []

    def on_dropped(sender: Any, count: int, **kwargs: Any) -> None:
        dropped.append(count)

    publish(pubsub, b'{"pk": 7}', event_id="evt-7")
    pull_until(inbox, subscriber, lambda: inbox.taken_in == 1)
    assert run_inbox().processed == 1
    assert not BillingInbox.objects.exists()  # handled: its inbox message is gone

    inbox_duplicates_dropped.connect(on_dropped, dispatch_uid="test-dropped")
    try:
        publish(pubsub, b'{"pk": 7}', event_id="evt-7")  # published again (a relay's retry)
        pull_until(inbox, subscriber, lambda: inbox.duplicates == 1)
    finally:
        inbox_duplicates_dropped.disconnect(dispatch_uid="test-dropped")
    assert dropped == [1]
    assert inbox.taken_in == 1
    assert not BillingInbox.objects.exists()
    assert Charge.objects.filter(order_pk=7).count() == 1
    assert inbox.pull_once(subscriber) == 0, "the dropped copy was not acked to Pub/Sub"


def test_a_message_without_an_event_id_is_keyed_by_its_pubsub_message_id(pubsub, puller) -> None:
    inbox, subscriber = puller
    message_id = publish(pubsub, b'{"pk": 1}')
    pull_until(inbox, subscriber, lambda: inbox.taken_in == 1)
    assert list(BillingInbox.objects.values_list("event_id", flat=True)) == [message_id]


def test_data_the_inbox_cannot_hold_is_not_acked_and_the_rest_is_taken_in(pubsub, puller) -> None:
    inbox, subscriber = puller
    publish(pubsub, b"not json", event_id="bad")
    publish(pubsub, b'{"pk": 2}', event_id="good")
    pull_until(inbox, subscriber, lambda: inbox.taken_in == 1)
    assert list(BillingInbox.objects.values_list("event_id", flat=True)) == ["good"]
    assert not SeenEvent.objects.filter(event_id="bad").exists()


def test_an_event_id_longer_than_a_seen_id_holds_is_not_acked_and_the_rest_is_taken_in() -> None:
    """The queue's key holds 512 characters, ``SeenEvent.event_id`` 255: a longer id is
    refused (not acked) as an id longer than the key is, and the pull's other events are
    taken in (before: the pull's transaction failed on the seen row, on Spanner, every time)."""
    inbox = InboxPuller(WideKeyQueue)
    long_id = "e" * 300
    received = [
        pubsub_v1.types.ReceivedMessage(
            ack_id=f"ack-{eid[:5]}",
            message=pubsub_v1.types.PubsubMessage(
                data=b"{}", attributes={"event_id": eid}, message_id=f"m-{eid[:5]}"
            ),
        )
        for eid in (long_id, "short")
    ]
    assert inbox.take_in(received) == ["ack-short"]
    assert list(WideKeyQueue.objects.values_list("event_id", flat=True)) == ["short"]
    assert list(SeenEvent.objects.values_list("event_id", flat=True)) == ["short"]


def test_seen_ids_older_than_the_window_are_pruned(pubsub) -> None:
    now = clock.now()
    SeenEvent.objects.bulk_create(
        [
            SeenEvent(
                id=seen_id("q", f"old{i}"),
                inbox="q",
                event_id=f"old{i}",
                seen_at=now - timedelta(days=8),
            )
            for i in range(3)
        ]
        + [SeenEvent(id=seen_id("q", "new"), inbox="q", event_id="new", seen_at=now)]
    )
    assert prune("q", 7, using="default") == 3
    assert list(SeenEvent.objects.values_list("event_id", flat=True)) == ["new"]


def _received(items: list[tuple[str, bytes]]) -> list[Any]:
    return [
        pubsub_v1.types.ReceivedMessage(
            ack_id=f"ack-{eid}",
            message=pubsub_v1.types.PubsubMessage(
                data=data, attributes={"event_id": eid}, message_id=f"m-{eid}"
            ),
        )
        for eid, data in items
    ]


def test_refused_events_cost_no_rerun_of_the_pulls_transaction() -> None:
    # before: each refused event rolled the pull's transaction back and ran it again: 50 bad
    # and 50 good events took 2,704 SQL statements, 50 good alone 104
    inbox = InboxPuller(BillingInbox)
    with CaptureQueriesContext(connections["default"]) as good_only:
        acked = inbox.take_in(_received([(f"g{i}", b'{"pk": 1}') for i in range(50)]))
    assert len(acked) == 50
    mixed = [(f"h{i}", b'{"pk": 1}') for i in range(50)] + [
        (f"b{i}", b"not json") for i in range(50)
    ]
    with CaptureQueriesContext(connections["default"]) as with_refused:
        acked = inbox.take_in(_received(mixed))
    assert sorted(acked) == sorted(f"ack-h{i}" for i in range(50))  # the bad ones not acked
    assert BillingInbox.objects.filter(event_id__startswith="h").count() == 50
    assert not SeenEvent.objects.filter(event_id__startswith="b").exists()
    assert len(with_refused) <= len(good_only) + 5, (len(with_refused), len(good_only))


def test_a_message_over_4_mib_does_not_stall_the_inbox_on_the_emulator(pubsub) -> None:
    # before: gRPC's 4 MiB limit on the emulator's channel failed every pull of the
    # subscription (ResourceExhausted), so no event behind the large one was taken in
    publish(pubsub, b'{"pad": "' + b"x" * (5 * 1024 * 1024) + b'"}', event_id="large")
    publish(pubsub, b'{"pk": 5}', event_id="small")
    inbox = InboxPuller(BillingInbox)
    inbox.start()
    try:
        wait_until(lambda: inbox.taken_in == 1, 60)
    finally:
        inbox.stop()
    assert inbox.pull_failures == 0
    # the large one reached the puller, which refused it as any data the queue cannot hold
    assert list(BillingInbox.objects.values_list("event_id", flat=True)) == ["small"]


def _ordered(items: list[tuple[str, str, bytes]]) -> list[Any]:
    """Pub/Sub's received messages of (event id, ordering key, data), in that order."""
    return [
        pubsub_v1.types.ReceivedMessage(
            ack_id=f"ack-{eid}",
            message=pubsub_v1.types.PubsubMessage(
                data=data, attributes={"event_id": eid}, message_id=f"m-{eid}", ordering_key=key
            ),
        )
        for eid, key, data in items
    ]


def test_an_ordered_inbox_runs_each_ordering_keys_events_in_publish_order(pubsub) -> None:
    """Events published under two ordering keys (and one without) through the emulator, on a
    subscription with message ordering on: the ordered inbox takes each in under its ordering
    key ("" for none), and a worker of 4 threads runs each key's events one at a time, in the
    order they were published."""
    publisher = pubsub_v1.PublisherClient(
        publisher_options=pubsub_v1.types.PublisherOptions(enable_message_ordering=True)
    )
    futures = [
        publisher.publish(
            pubsub.topic,
            json.dumps({"seq": seq}).encode(),
            event_id=f"{key}{seq}",
            ordering_key=key,
        )
        for seq in range(4)
        for key in ("a", "b")
    ]
    futures.append(publisher.publish(pubsub.topic, b'{"seq": 0}', event_id="none0"))
    for future in futures:
        future.result(30)
    inbox = InboxPuller(OrderedBillingInbox)
    subscriber = pubsub_v1.SubscriberClient()
    try:
        pull_until(inbox, subscriber, lambda: inbox.taken_in == 9)
    finally:
        subscriber.close()
    assert sorted(OrderedBillingInbox.objects.values_list("ordering_key", "event_id")) == [
        ("", "none0"),
        *[("a", f"a{seq}") for seq in range(4)],
        *[("b", f"b{seq}") for seq in range(4)],
    ]

    lock = threading.Lock()
    ran: dict[str, list[int]] = defaultdict(list)
    running: dict[str, int] = defaultdict(int)
    overlaps: list[str] = []
    registry = ReceiverRegistry()
    database = engine_for(OrderedBillingInbox).database

    def record(key: str, seq: int) -> None:
        with lock:
            ran[key].append(seq)

    @register_receiver(OrderedBillingInbox, registry=registry)
    def handle(message: Message) -> None:
        key, seq = message.key_dict["ordering_key"], message.json()["seq"]
        with lock:
            running[key] += 1
            if running[key] > 1:
                overlaps.append(key)
        try:
            # on commit: a transaction the database aborted runs its receiver again
            transaction.on_commit(lambda: record(key, seq), using=database)
        finally:
            with lock:
                running[key] -= 1

    worker = Worker(
        [OrderedBillingInbox], registry=registry, install_signal_handlers=False, concurrency=4
    )

    def run() -> None:
        worker.run()
        connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_until(lambda: sum(len(v) for v in ran.values()) >= 9, 120)
    finally:
        worker.stop()
        thread.join(60)
    assert dict(ran) == {"a": [0, 1, 2, 3], "b": [0, 1, 2, 3], "": [0]}
    assert overlaps == []


def test_an_event_an_ordered_inbox_cannot_hold_holds_back_the_rest_of_its_key() -> None:
    """Taken in, the events after a refused one (data the queue cannot hold) would run before
    it: they are left unacked too, for Pub/Sub to deliver again behind it; other keys, and
    events without a key, are taken in."""
    inbox = InboxPuller(OrderedBillingInbox)
    acked = inbox.take_in(
        _ordered(
            [
                ("k1", "k", b'{"pk": 1}'),
                ("k2", "k", b"not json"),
                ("k3", "k", b'{"pk": 3}'),
                ("j1", "j", b'{"pk": 4}'),
                ("n1", "", b"not json"),
                ("n2", "", b'{"pk": 6}'),
            ]
        )
    )
    assert acked == ["ack-k1", "ack-j1", "ack-n2"]
    assert sorted(OrderedBillingInbox.objects.values_list("ordering_key", "event_id")) == [
        ("", "n2"),
        ("j", "j1"),
        ("k", "k1"),
    ]
    assert sorted(SeenEvent.objects.values_list("event_id", flat=True)) == ["j1", "k1", "n2"]

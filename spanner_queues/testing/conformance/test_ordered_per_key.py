"""Conformance: an ordered queue (``QueueMeta.ordered_by``) hands out each ordering key's
messages one at a time, in send order: ``receive`` gives only a key's head (no earlier message
of its key exists, leased, backing off or not yet due), so a failing or leased head holds back
its key and no other; a message given back under its key keeps its place. Engines that leave
the order to the worker (``supports_ordered_receive`` False: native queues, whose RECEIVE has no
order) are checked through the worker (``test_ordered_delivery_through_the_worker.py``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

from spanner_queues import api, clock
from spanner_queues.engines import engine_for
from spanner_queues.testing.conformance.models import OrderedEvents
from spanner_queues.testing.conformance.support import receive_due, wait_until
from spanner_queues.worker.apply import DeliveryPolicy

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.requires("supports_ordered_receive"),
]


def ids(messages: list) -> list[tuple[str, str]]:
    return sorted((m.key_dict["customer"], m.key_dict["message_id"]) for m in messages)


def test_a_key_is_handed_out_one_message_at_a_time_in_send_order() -> None:
    # message ids against their send order: the key's order is the send order, not the key's
    for message_id in ("z", "m", "a"):
        OrderedEvents.send(customer="c1", message_id=message_id)
    seen = []
    for _ in range(3):
        got = api.receive(OrderedEvents, max_messages=10)
        assert len(got) == 1
        seen.append(got[0].key_dict["message_id"])
        assert api.receive(OrderedEvents, max_messages=10) == []  # the rest wait for its ack
        api.ack(got[0])
    assert seen == ["z", "m", "a"]


def test_other_keys_are_not_held_back() -> None:
    OrderedEvents.send_many(
        [
            {"customer": "c1", "message_id": "1"},
            {"customer": "c1", "message_id": "2"},
            {"customer": "c2", "message_id": "1"},
            {"customer": "c3", "message_id": "1"},
        ]
    )
    assert ids(api.receive(OrderedEvents, max_messages=10)) == [
        ("c1", "1"),
        ("c2", "1"),
        ("c3", "1"),
    ]


@pytest.mark.requires("supports_release")
def test_a_failed_head_backing_off_holds_back_its_key_only() -> None:
    OrderedEvents.send(customer="c1", message_id="b")
    OrderedEvents.send(customer="c1", message_id="a")
    head = api.receive(OrderedEvents)[0]
    assert head.key_dict["message_id"] == "b"
    api.release(head, deliver_time=clock.now() + timedelta(hours=1))  # its back-off
    OrderedEvents.send(customer="c2", message_id="a")
    assert ids(api.receive(OrderedEvents, max_messages=10)) == [("c2", "a")]


@pytest.mark.requires("supports_release")
def test_a_head_given_back_goes_first_again() -> None:
    OrderedEvents.send(customer="c1", message_id="b")
    OrderedEvents.send(customer="c1", message_id="a")
    head = api.receive(OrderedEvents)[0]
    api.release(head)  # due now
    assert ids(receive_due(OrderedEvents, max_messages=10)) == [("c1", "b")]


def test_a_delayed_head_holds_back_the_later_messages_of_its_key() -> None:
    OrderedEvents.send(customer="c1", message_id="1", delay=timedelta(hours=1))
    OrderedEvents.send(customer="c1", message_id="2")
    OrderedEvents.send(customer="c2", message_id="1")
    assert ids(api.receive(OrderedEvents, max_messages=10)) == [("c2", "1")]


@pytest.mark.requires("supports_custom_lease")
def test_a_head_whose_lease_ran_out_comes_again_before_the_next() -> None:
    OrderedEvents.send(customer="c1", message_id="1")
    OrderedEvents.send(customer="c1", message_id="2")
    first = api.receive(OrderedEvents, lease=timedelta(milliseconds=200))[0]
    seen: list = []

    def again() -> bool:
        seen.extend(api.receive(OrderedEvents, max_messages=10, lease=timedelta(seconds=30)))
        return bool(seen)

    wait_until(again, timeout=60)  # after the lease and the back-off of attempt 1
    assert [m.key for m in seen] == [first.key]
    assert seen[0].attempt == 2


def test_a_message_given_back_under_its_key_keeps_its_place() -> None:
    OrderedEvents.send(customer="c1", message_id="1")
    OrderedEvents.send(customer="c1", message_id="2")
    head = receive_due(OrderedEvents)[0]
    policy = DeliveryPolicy(engine_for(OrderedEvents))
    with transaction.atomic():  # a Retry: ack and send again under its key, due now
        policy.resend(OrderedEvents, [head], [None], using=engine_for(OrderedEvents).database)
    got = api.receive(OrderedEvents, max_messages=10)
    assert [m.key for m in got] == [head.key]
    api.ack(got[0])
    assert ids(api.receive(OrderedEvents, max_messages=10)) == [("c1", "2")]


def test_acking_the_head_lets_the_next_go_in_the_same_claim() -> None:
    OrderedEvents.send(customer="c1", message_id="1")
    OrderedEvents.send(customer="c1", message_id="2")
    head = api.receive(OrderedEvents)[0]
    with transaction.atomic():
        api.ack(head)
    assert ids(api.receive(OrderedEvents, max_messages=10)) == [("c1", "2")]


def test_a_send_in_a_rolled_back_transaction_takes_no_place() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        OrderedEvents.send(customer="c1", message_id="lost")
        raise RuntimeError("the sender's transaction rolls back")
    OrderedEvents.send(customer="c1", message_id="1")
    assert ids(api.receive(OrderedEvents, max_messages=10)) == [("c1", "1")]


def test_each_message_of_a_key_is_sent_later_than_the_last() -> None:
    sent = OrderedEvents.send_many([{"customer": "c1", "message_id": str(i)} for i in range(5)])
    sent.append(OrderedEvents.send(customer="c1", message_id="5"))
    times = [m.send_time for m in sent if m.send_time is not None]
    assert times == sorted(times)
    assert len(set(times)) == len(times) == 6

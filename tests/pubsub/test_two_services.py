"""Two services through real ``runqueueworker`` processes: an order saved in service A sends its
event (the outbox), the relay worker publishes it, the inbox worker of service B takes it in,
and B's receiver does its work (a ``Charge``). Under repeated SIGKILLs of the relay and the
inbox workers every event's work is done in B exactly once and no message is left."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from typing import Any

import pytest
from django.db import transaction
from google.cloud import pubsub_v1

from spanner_queues.contrib.pubsub.inbox import InboxPuller
from tests.children import Child
from tests.conftest import wait_until
from tests.pubsubapp.models import BillingInbox, Charge, Order, OrderEvents, OrderEventsDead

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

RELAY = ("pubsubapp.OrderEvents", "--lease", "3", "--concurrency", "2", "-v0")
INBOX = ("pubsubapp.BillingInbox", "--lease", "3", "-v0")


def create_orders(n: int) -> list[int]:
    ids = []
    for i in range(n):
        with transaction.atomic():  # the order and its event commit together
            ids.append(Order.objects.create(amount=i).pk)
    return ids


def progress() -> tuple[int, int]:
    return Charge.objects.count(), OrderEvents.objects.count()


def drain_leftovers(pubsub: Any) -> int:
    """Pull what Pub/Sub still holds (redeliveries of messages a killed inbox never acked) until
    a whole ack deadline passed with nothing: each must be dropped as a duplicate."""
    puller = InboxPuller(BillingInbox)
    subscriber = pubsub_v1.SubscriberClient()
    try:
        quiet_since: list[float] = []

        def quiet() -> bool:
            if puller.pull_once(subscriber):
                quiet_since.clear()
                return False
            if not quiet_since:
                quiet_since.append(time.monotonic())
            return time.monotonic() - quiet_since[0] > 11  # the subscription's ack deadline

        wait_until(quiet, 120)
    finally:
        subscriber.close()
    return puller.taken_in


def test_each_event_does_its_work_in_service_b_once(pubsub, child_env, tmp_path) -> None:
    env = pubsub.env(child_env)
    relay = Child(env, tmp_path, *RELAY, name="relay")
    inbox = Child(env, tmp_path, *INBOX, name="inbox")
    try:
        orders = create_orders(20)
        wait_until(lambda: Charge.objects.count() == 20, 120)
    finally:
        for child in (relay, inbox):
            child.proc.send_signal(signal.SIGTERM)
        assert relay.wait() == 0, relay.output()
        assert inbox.wait() == 0, inbox.output()
    assert Counter(Charge.objects.values_list("order_pk", flat=True)) == Counter(orders)
    assert not OrderEvents.objects.exists() and not BillingInbox.objects.exists()
    assert not OrderEventsDead.objects.exists()


def test_under_sigkills_of_relay_and_inbox_each_event_does_its_work_once(
    pubsub, child_env, tmp_path
) -> None:
    rng = random.Random(32)
    env = pubsub.env(child_env)
    started = 0

    def start(args: tuple[str, ...], name: str) -> Child:
        nonlocal started
        started += 1
        return Child(env, tmp_path, *args, name=f"{name}{started}")

    relay, inbox = start(RELAY, "relay"), start(INBOX, "inbox")
    orders: list[int] = []
    kills = 0
    try:
        for _ in range(6):
            orders += create_orders(8)
            before = progress()
            # let some work start, then kill mid-flight: a publish not yet acked, a pull not
            # yet acked to Pub/Sub, a charge not yet committed
            wait_until(
                lambda before=before: progress() != before or BillingInbox.objects.exists(),
                60,
            )
            victim = rng.choice(["relay", "inbox", "both"])
            if victim in ("relay", "both"):
                relay.proc.kill()
                relay.proc.wait()
                relay = start(RELAY, "relay")
                kills += 1
            if victim in ("inbox", "both"):
                inbox.proc.kill()
                inbox.proc.wait()
                inbox = start(INBOX, "inbox")
                kills += 1
        wait_until(lambda: Charge.objects.values("order_pk").distinct().count() == len(orders), 180)
        wait_until(
            lambda: not OrderEvents.objects.exists() and not BillingInbox.objects.exists(), 60
        )
    finally:
        for child in (relay, inbox):
            child.kill()
    assert kills >= 6
    late = drain_leftovers(pubsub)
    assert late == 0, "a redelivered copy was taken in again"
    assert Counter(Charge.objects.values_list("order_pk", flat=True)) == Counter(orders), (
        "an event's work was done more than once, or not at all"
    )
    assert not OrderEvents.objects.exists() and not BillingInbox.objects.exists()
    assert not OrderEventsDead.objects.exists()

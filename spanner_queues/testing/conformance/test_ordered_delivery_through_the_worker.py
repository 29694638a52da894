"""Conformance: the worker delivers an ordered queue's messages (``QueueMeta.ordered_by``) one
at a time per ordering key, in send order, through failures and retries, on every engine (where
``receive`` hands out every due message, as native queues' RECEIVE does, the worker keeps the
order itself); other keys go on meanwhile."""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction

from spanner_queues.engines import engine_for
from spanner_queues.exceptions import Retry
from spanner_queues.message import Message
from spanner_queues.receivers import ReceiverRegistry
from spanner_queues.receivers import receiver as register_receiver
from spanner_queues.testing.conformance.models import OrderedEvents
from spanner_queues.testing.conformance.support import wait_until
from spanner_queues.worker import Worker, WorkerEvents

pytestmark = pytest.mark.django_db(transaction=True)

KEYS, PER_KEY = 3, 4


def test_each_key_is_run_in_send_order_one_at_a_time_through_failures() -> None:
    lock = threading.Lock()
    running: dict[str, int] = defaultdict(int)
    overlaps: list[str] = []
    done: dict[str, list[int]] = defaultdict(list)
    tried: set[tuple[str, int]] = set()

    def record(customer: str, seq: int) -> None:
        with lock:
            done[customer].append(seq)

    registry = ReceiverRegistry()

    @register_receiver(OrderedEvents, registry=registry)
    def handle(message: Message) -> None:
        customer, seq = message.key_dict["customer"], message.json()["seq"]
        with lock:
            running[customer] += 1
            if running[customer] > 1:
                overlaps.append(customer)
            first = (customer, seq) not in tried
            tried.add((customer, seq))
        try:
            if first and customer == "c0" and seq == 1:
                raise RuntimeError("the first try of c0's first message fails")
            if first and customer == "c1" and seq == 2:
                raise Retry(after=timedelta(0))
            # on commit: a transaction the database aborted runs its receiver again
            db = engine_for(OrderedEvents).database
            transaction.on_commit(lambda: record(customer, seq), using=db)
        finally:
            with lock:
                running[customer] -= 1

    # message ids against the send order: order is the send order, not the key's
    for seq in range(1, PER_KEY + 1):
        OrderedEvents.send_many(
            [
                {"customer": f"c{k}", "message_id": f"m{PER_KEY - seq}", "payload": {"seq": seq}}
                for k in range(KEYS)
            ]
        )
    events = WorkerEvents()
    worker = Worker(
        [OrderedEvents],
        registry=registry,
        listeners=[events],
        install_signal_handlers=False,
        concurrency=4,
    )

    def run() -> None:
        worker.run()
        connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_until(lambda: sum(len(v) for v in done.values()) >= KEYS * PER_KEY, timeout=120)
    finally:
        worker.stop()
        thread.join(60)
    expected: dict[str, Any] = {f"c{k}": list(range(1, PER_KEY + 1)) for k in range(KEYS)}
    assert dict(done) == expected
    assert overlaps == []
    wait_until(lambda: not OrderedEvents.objects.exists(), timeout=30)


def test_a_head_given_up_lets_the_next_of_its_key_go() -> None:
    """A head that fails on every attempt holds its key back until it is given up (discarded
    past ``max_attempts``, as a dead letter would be), then the next message of its key runs."""
    lock = threading.Lock()
    events_of: list[tuple[str, int]] = []

    def record(what: str, seq: int) -> None:
        with lock:
            events_of.append((what, seq))

    registry = ReceiverRegistry()

    @register_receiver(OrderedEvents, registry=registry)
    def handle(message: Message) -> None:
        seq = message.json()["seq"]
        if seq == 1:
            record("failed", 1)
            raise RuntimeError("message 1 always fails")
        db = engine_for(OrderedEvents).database
        transaction.on_commit(lambda: record("done", seq), using=db)

    OrderedEvents.send_many(
        [{"customer": "c0", "message_id": f"m{9 - s}", "payload": {"seq": s}} for s in (1, 2, 3)]
    )
    worker = Worker([OrderedEvents], registry=registry, install_signal_handlers=False)

    def run() -> None:
        worker.run()
        connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_until(lambda: ("done", 3) in events_of, timeout=120)
    finally:
        worker.stop()
        thread.join(60)
    max_attempts = OrderedEvents.QueueMeta.max_attempts
    assert events_of == [("failed", 1)] * max_attempts + [("done", 2), ("done", 3)]

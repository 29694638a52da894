"""The failure ledger on native queues (``spanner_queues.failures``): a record belongs to one
sent message. An ack writes to the ledger only for a message that may have failed (a first
delivery has no record: its ack neither reads nor deletes one); a record of a message that is
gone is not the next message's, is started again by its first failure, and is pruned."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest
from django.db import transaction

from spanner_queues import api, clock
from spanner_queues.engines import engines
from spanner_queues.failures import FailedDelivery, key_text
from spanner_queues.message import Message
from spanner_queues.worker.apply import DeliveryPolicy
from tests.conftest import wait_until
from tests.testapp.models import Jobs

pytestmark = pytest.mark.django_db(transaction=True)
LEDGER = FailedDelivery._meta.db_table
#: the prune's read of the ledger (`failures.stale_records`)
STALE = "updated_at < @"


def _receive(count: int) -> list[Message]:
    got: list[Message] = []

    def enough() -> bool:
        got.extend(api.receive(Jobs, max_messages=count - len(got)))
        return len(got) >= count

    wait_until(enough, timeout=60)
    return got


def test_acking_first_deliveries_neither_reads_nor_writes_the_ledger(front) -> None:
    api.send_many(Jobs, [{"id": f"first{i}", "payload": b"x"} for i in range(10)])
    try:
        messages = _receive(10)
        front.clear()
        with transaction.atomic():
            api.ack_many(Jobs, messages)
        assert front.sql(LEDGER) == []
        assert [m.attempt for m in messages] == [1] * 10
        assert front.sql(LEDGER) == []  # (a first delivery's attempt is known: 1)
    finally:
        api.stop_receiving(Jobs, wait=10)


def test_the_ack_of_a_message_that_failed_deletes_its_record_in_the_same_transaction(
    front,
) -> None:
    Jobs.send(id="failed", payload=b"x")
    try:
        [message] = _receive(1)
        DeliveryPolicy(engines["default"]).fail(Jobs, message, RuntimeError("no"), using="default")
        assert FailedDelivery.objects.count() == 1
        front.clear()
        with transaction.atomic():
            api.ack(message)
        [delete] = front.sql(f"DELETE FROM {LEDGER}")
        assert delete.request.transaction.id  # in the ack's read-write transaction
        assert len(front.commits()) == 1
        assert not FailedDelivery.objects.exists()
    finally:
        api.stop_receiving(Jobs, wait=10)


def test_a_record_of_an_earlier_message_is_started_again_by_the_next_failure() -> None:
    engine = engines["default"]
    Jobs.send(id="k", payload=b"x")
    try:
        [first] = _receive(1)
        engine.record_failure(Jobs, first, RuntimeError("1"), using="default")
        engine.record_failure(Jobs, first, RuntimeError("2"), using="default")
        Jobs.objects.filter(pk="k").delete()  # (the ORM: as a cascade, nothing of ours runs)
        Jobs.send(id="k", payload=b"y")
        [second] = _receive(1)
        assert second.attempt == 1
        assert engine.record_failure(Jobs, second, RuntimeError("3"), using="default") == 1
    finally:
        api.stop_receiving(Jobs, wait=10)


def test_prune_deletes_the_records_of_messages_that_are_gone_and_keeps_the_others() -> None:
    engine = engines["default"]
    Jobs.send(id="live", payload=b"x")
    Jobs.send(id="later", payload=b"x")  # sent after its record's failed run
    old = clock.now() - timedelta(hours=2)
    live_due = Jobs.objects.get(pk="live").deliver_time
    later_due = Jobs.objects.get(pk="later").deliver_time
    for key, leased_at in (
        ("live", live_due + timedelta(seconds=1)),
        ("gone", old),
        ("later", later_due - timedelta(seconds=1)),
    ):
        FailedDelivery.objects.create(
            queue=Jobs._meta.label,
            message_key=key_text((key,)),
            failures=3,
            updated_at=old,
            leased_at=leased_at,
        )
    FailedDelivery.objects.create(  # not old enough to be looked at
        queue=Jobs._meta.label,
        message_key=key_text(("recent",)),
        failures=1,
        updated_at=clock.now(),
    )
    with transaction.atomic():
        assert engine.prune_failures(Jobs, using="default") == 2
    assert sorted(FailedDelivery.objects.values_list("message_key", flat=True)) == [
        key_text(("live",)),
        key_text(("recent",)),
    ]


def test_prune_goes_on_past_records_of_queued_messages(monkeypatch) -> None:
    """Each prune looks at the next records: records of messages still queued, the oldest,
    never stall it before the records of messages that are gone."""
    from spanner_queues.engines import native

    monkeypatch.setattr(native, "PRUNE_BATCH", 2)
    monkeypatch.setattr(native, "_prune_from", {})
    engine = engines["default"]
    base = clock.now() - timedelta(hours=3)
    for i, key in enumerate(["queued-1", "queued-2", "gone"]):
        if key.startswith("queued"):
            Jobs.send(id=key, payload=b"x")
        FailedDelivery.objects.create(
            queue=Jobs._meta.label,
            message_key=key_text((key,)),
            failures=1,
            updated_at=base + timedelta(minutes=i),  # the queued ones oldest
            leased_at=clock.now() + timedelta(hours=1),  # theirs (after their DeliverTime)
        )
    with transaction.atomic():
        assert engine.prune_failures(Jobs, using="default") == 0  # the two queued ones
    with transaction.atomic():
        assert engine.prune_failures(Jobs, using="default") == 1  # then the gone one
    assert sorted(FailedDelivery.objects.values_list("message_key", flat=True)) == [
        key_text(("queued-1",)),
        key_text(("queued-2",)),
    ]
    with transaction.atomic():  # back to the start: the queued ones again, kept
        assert engine.prune_failures(Jobs, using="default") == 0
    assert FailedDelivery.objects.count() == 2


def test_a_prune_that_fails_never_costs_the_failure_record(front, monkeypatch, caplog) -> None:
    """The prune a failure's record makes due (once an hour per queue) runs in the queue's
    next receive outside a transaction, in a transaction of its own, never in the record's
    (nor past its commit): when it fails the record stays."""
    from spanner_queues.engines import native

    monkeypatch.setattr(native, "_pruned", {})  # (the next failure of the queue prunes)
    monkeypatch.setattr(native, "_prune_due", {})  # (none left due by an earlier test)
    Jobs.send(id="kept", payload=b"x")
    try:
        [message] = _receive(1)
        # (twice: the client sends a transaction's failed first statement again, after an
        # explicit BeginTransaction)
        front.fail("ExecuteStreamingSql", "INVALID_ARGUMENT", "prune", sql_contains=STALE, times=2)
        with contextlib.suppress(Exception), transaction.atomic():
            engines["default"].record_failure(Jobs, message, RuntimeError("no"), using="default")
            api.receive(Jobs, wait=0)  # (in a transaction: the prune waits)
        assert front.sql(STALE) == []
        assert FailedDelivery.objects.get(message_key=key_text(("kept",))).failures == 1
        api.receive(Jobs, wait=0)
        assert front.sql(STALE)  # the prune ran, and failed
        assert FailedDelivery.objects.get(message_key=key_text(("kept",))).failures == 1
        assert "pruning the failure ledger of testapp.Jobs failed" in caplog.text
    finally:
        api.stop_receiving(Jobs, wait=10)

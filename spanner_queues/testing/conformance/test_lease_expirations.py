"""Conformance: ``engine.lease_expirations(model)``, the count behind Spanner's
``lease_expiration_count`` metric, and ``engine.deliver_time_moves(model)``, the failure
ledger's tripwire."""

from __future__ import annotations

from datetime import timedelta

import pytest

from spanner_queues import api
from spanner_queues.engines import engines
from spanner_queues.testing.conformance.models import Jobs
from spanner_queues.testing.conformance.support import receive_due, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
SHORT = timedelta(seconds=0.3)


def test_every_engine_reports_a_count() -> None:
    count = engines["default"].lease_expirations(Jobs)
    assert isinstance(count, int) and count >= 0


@pytest.mark.requires("stores_bookkeeping_fields", "supports_custom_lease")
def test_a_lease_that_ran_out_is_counted_when_the_message_is_claimed_again() -> None:
    engine = engines["default"]
    before = engine.lease_expirations(Jobs)
    Jobs.send(id="lapse", payload="x")
    [first] = receive_due(Jobs, lease=SHORT)
    assert engine.lease_expirations(Jobs) == before
    [again] = wait_until(lambda: api.receive(Jobs, lease=SHORT), timeout=30)
    assert again.attempt == first.attempt + 1
    assert engine.lease_expirations(Jobs) == before + 1


@pytest.mark.requires("stores_bookkeeping_fields", "supports_release")
def test_a_released_or_acked_lease_is_not_counted() -> None:
    engine = engines["default"]
    before = engine.lease_expirations(Jobs)
    Jobs.send(id="kept", payload="x")
    [first] = receive_due(Jobs)
    api.release(first)
    [again] = receive_due(Jobs)
    api.ack(again)
    assert engine.lease_expirations(Jobs) == before


def test_a_delivery_of_a_store_that_keeps_deliver_time_is_not_counted_as_moved() -> None:
    """``engine.deliver_time_moves(model)``: deliveries whose ``DeliverTime`` was later than
    their lease's start (the store moves it on a lease). The table engine keeps its own
    count (0); the native engine counts none while Spanner keeps the sender's time (the
    emulator front's default)."""
    engine = engines["default"]
    before = engine.deliver_time_moves(Jobs)
    assert isinstance(before, int) and before >= 0
    Jobs.send(id="due", payload="x")
    [message] = receive_due(Jobs)
    api.ack(message)
    assert engine.deliver_time_moves(Jobs) == before

"""Whose a failure record is (``failures.belongs``) under each answer Spanner could give about
``DeliverTime`` on a lease (the specification's §7 leaves it open), for the deliveries of one
failing message and for a message sent again under its key. The front plays the answers where
``RECEIVE`` shows the moved value (``tests/native/test_failure_ledger_deliver_time.py``); these
are the sequences of ``DeliverTime`` a delivery would show under each, the record written by
the failed run before it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from spanner_queues.failures import (
    FailedDelivery,
    Seen,
    belongs,
    first_delivery,
    moved_deliver_time,
)
from spanner_queues.semantics import LEASE

SENT = datetime(2026, 1, 1, tzinfo=timezone.utc)
#: the failed run's lease began 5 s after the message was sent
LEASED = SENT + timedelta(seconds=5)
EXPIRES = LEASED + LEASE
BACKOFF = timedelta(seconds=1)


def record(*, deliver_time: datetime = SENT, event_id: str = "") -> FailedDelivery:
    return FailedDelivery(
        failures=1,
        leased_at=LEASED,
        lease_expires_at=EXPIRES,
        deliver_time=deliver_time,
        event_id=event_id,
    )


def test_kept_the_next_delivery_is_the_records_and_a_later_send_is_not() -> None:
    assert belongs(record(), Seen(SENT))
    assert not belongs(record(), Seen(EXPIRES + timedelta(minutes=5)))  # sent again since


def test_moved_to_the_lease_expiry_and_shown_before_the_move_is_the_records() -> None:
    # the next delivery shows the failed run's lease expiry, not later than its own start
    assert belongs(record(), Seen(EXPIRES))
    assert not first_delivery(EXPIRES, EXPIRES + BACKOFF + LEASE) or belongs(
        record(), Seen(EXPIRES)
    )


def test_moved_and_shown_after_the_move_trips_the_wire_and_the_record_is_the_keys() -> None:
    start = EXPIRES + BACKOFF
    for shown in (start + LEASE, start + LEASE + BACKOFF):  # lease_expiry, next_due
        assert moved_deliver_time(shown, start + LEASE)
        assert belongs(record(deliver_time=EXPIRES), Seen(shown), moved=True)
    assert not moved_deliver_time(SENT, start + LEASE)  # kept: never


def test_an_event_id_tells_a_new_send_under_every_answer() -> None:
    ours = record(event_id="a")
    for moved in (False, True):
        assert belongs(ours, Seen(EXPIRES + timedelta(hours=5), "a"), moved=moved)
        assert not belongs(ours, Seen(SENT, "b"), moved=moved)

"""How ``spannerprobe`` names what a message's ``DeliverTime`` did across its leases (the answers
Google leaves open, spec §7): kept, moved to a lease's expiry, moved to when it was due again,
or moved elsewhere. Pure: timestamps as Spanner would give them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spanner_queues.contrib.drill.probe import Row, deliver_time_answers, deliver_time_rule_holds

SENT = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
S = timedelta(seconds=1)


def lease(at: datetime, deliver_time: datetime) -> Row:
    """A delivery leased at ``at`` (its lease ends 10 s later)."""
    return Row(1, "p", deliver_time, "t", at + 10 * S)


def test_a_deliver_time_kept_through_redeliveries() -> None:
    leases = [lease(SENT, SENT), lease(SENT + 11 * S, SENT), lease(SENT + 23 * S, SENT)]
    assert deliver_time_answers(SENT, leases) == ("kept", ["kept", "kept"])


def test_a_deliver_time_moved_to_each_leases_expiry() -> None:
    first = lease(SENT, SENT + 10 * S)
    second = lease(SENT + 11 * S, SENT + 21 * S)
    assert deliver_time_answers(SENT, [first, second]) == ("lease_expiry", ["lease_expiry"])


def test_a_deliver_time_moved_to_the_previous_leases_expiry_on_redelivery() -> None:
    first = lease(SENT, SENT)
    second = lease(SENT + 11 * S, SENT + 10 * S)
    assert deliver_time_answers(SENT, [first, second]) == ("kept", ["lease_expiry"])


def test_a_deliver_time_moved_to_when_the_message_was_due_again() -> None:
    first = lease(SENT, SENT)
    due = SENT + 11 * S  # the lease's end and a 1 s back-off
    second = lease(due + timedelta(milliseconds=300), due)
    assert deliver_time_answers(SENT, [first, second]) == ("kept", ["next_due"])


def test_a_deliver_time_moved_elsewhere_says_where() -> None:
    first = lease(SENT + 3 * S, SENT + 2 * S)
    second = lease(SENT + 30 * S, SENT + 5 * S)
    on_lease, [redelivery] = deliver_time_answers(SENT, [first, second])
    assert on_lease == "moved by 0:00:02"
    assert redelivery == f"moved to {(SENT + 5 * S).isoformat()}"


def test_the_rule_holds_where_deliver_time_is_kept_or_shows_the_failed_leases_expiry() -> None:
    first = lease(SENT, SENT)
    kept = [first, lease(SENT + 11 * S, SENT)]
    previous_expiry = [first, lease(SENT + 11 * S, SENT + 10 * S)]
    assert deliver_time_rule_holds(kept, ["kept"])
    assert deliver_time_rule_holds(previous_expiry, ["lease_expiry"])


def test_the_rule_holds_where_a_moved_deliver_time_trips_the_fail_closed_rule() -> None:
    leases = [lease(SENT, SENT + 10 * S), lease(SENT + 11 * S, SENT + 21 * S)]
    assert deliver_time_rule_holds(leases, ["lease_expiry"])


def test_the_rule_does_not_hold_where_deliver_time_moves_to_the_next_due_time_unseen() -> None:
    due = SENT + 11 * S
    leases = [lease(SENT, SENT), lease(due + timedelta(milliseconds=300), due)]
    assert not deliver_time_rule_holds(leases, ["next_due"])

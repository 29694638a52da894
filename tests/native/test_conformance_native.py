"""The conformance cases that apply to the native engine, run on the fake (or real Spanner).

Left out, by feature: ``release`` (``supports_release=False``), attempt counts and back-off
(``supports_attempt_count=False``: Spanner keeps no delivery count and its back-off is its
own), caller-chosen lease lengths (Spanner leases for 10 s), the table engine's stats states,
and the multi-process claimers (a child process cannot reach the in-process fake). Native
versions of the receive cases that need those follow below.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from spanner_queues import api
from spanner_queues.engines import engines
from spanner_queues.exceptions import LeaseLost
from tests.conformance import (
    test_ack,
    test_concurrency,
    test_dead_letter,
    test_orm,
    test_payload_types,
    test_send,
)
from tests.conformance import test_receive as conf_receive
from tests.conftest import receive_due, wait_until
from tests.testapp.models import Jobs, UserTasks

pytestmark = pytest.mark.django_db(transaction=True)

# --- sending --------------------------------------------------------------------------------
test_rollback_leaves_no_message = test_send.test_rollback_leaves_no_message
test_commit_makes_message_receivable = test_send.test_commit_makes_message_receivable
test_payload_kinds_are_stored_as_bytes = test_send.test_payload_kinds_are_stored_as_bytes
test_malformed_payload_writes_nothing = test_send.test_malformed_payload_writes_nothing_and_says_why
test_send_many_is_all_or_nothing_on_bad_input = (
    test_send.test_send_many_is_all_or_nothing_on_bad_input
)
test_payload_limit = test_send.test_payload_limit
test_duplicate_key_fails_cleanly = test_send.test_duplicate_key_fails_cleanly
test_single_column_key_with_default = test_send.test_single_column_key_with_default
test_bad_keys_and_times_are_rejected = test_send.test_bad_keys_and_times_are_rejected
test_unknown_queue_is_a_clear_error = test_send.test_unknown_queue_is_a_clear_error
test_past_deliver_time_means_now = test_send.test_past_deliver_time_means_now
test_replace_swaps_the_message_under_one_key = (
    test_send.test_replace_swaps_the_message_under_one_key
)

# --- payload types --------------------------------------------------------------------------
test_declared_payload_types_choose_the_payload_field = (
    test_payload_types.test_declared_payload_types_choose_the_payload_field
)
test_string_payload_round_trip = test_payload_types.test_string_payload_round_trip
test_string_payload_must_be_utf8 = test_payload_types.test_string_payload_must_be_utf8
test_json_payload_round_trip_is_canonical_json = (
    test_payload_types.test_json_payload_round_trip_is_canonical_json
)
test_json_payload_bytes_must_be_json = test_payload_types.test_json_payload_bytes_must_be_json

# --- acking ---------------------------------------------------------------------------------
test_ack_deletes_with_business_writes = test_ack.test_ack_deletes_with_business_writes
test_ack_in_rolled_back_transaction = test_ack.test_ack_in_rolled_back_transaction_leaves_message
test_second_ack_is_detected = test_ack.test_second_ack_is_detected
test_ack_many_is_all_or_nothing = test_ack.test_ack_many_is_all_or_nothing
test_ack_does_not_check_the_lease_token = test_ack.test_ack_does_not_check_the_lease_token

# --- rows -----------------------------------------------------------------------------------
test_messages_are_queryable_rows = test_orm.test_messages_are_queryable_rows
test_orm_update_is_refused = test_orm.test_orm_update_is_refused
test_orm_create_and_delete_work = test_orm.test_orm_create_and_delete_work
test_interleaved_queue_is_deleted_with_its_parent = (
    test_orm.test_interleaved_queue_is_deleted_with_its_parent
)
test_interleaved_cascade_in_the_database = (
    test_orm.test_interleaved_cascade_in_the_database_where_supported
)

# --- receiving ------------------------------------------------------------------------------
test_future_deliver_time_is_not_received_early = (
    conf_receive.test_future_deliver_time_is_not_received_early
)
test_leased_message_is_not_delivered_twice = conf_receive.test_leased_message_is_not_delivered_twice
test_renewal_keeps_message_and_rotates_token = (
    conf_receive.test_renewal_keeps_message_and_rotates_token
)
test_batch_receive_respects_max_messages = conf_receive.test_batch_receive_respects_max_messages
test_threads_never_share_a_message = test_concurrency.test_threads_never_share_a_message
test_dead_letter_needs_a_declared_queue = test_dead_letter.test_dead_letter_needs_a_declared_queue


# --- native versions ------------------------------------------------------------------------
def test_lease_expiry_redelivers_with_a_new_token(fake) -> None:
    if fake is not None:
        fake.lease_seconds = 1.0  # real Spanner: 10 s
    UserTasks.send(user_id=1, message_id="a", payload="x")
    [first] = receive_due(UserTasks)
    second = wait_until(lambda: api.receive(UserTasks), timeout=60)[0]
    assert timezone.now() >= first.lease_expires_at
    assert second.key == first.key and second.lease_token != first.lease_token


def test_renewing_an_expired_lease_is_lost(fake) -> None:
    if fake is not None:
        fake.lease_seconds = 1.0
    UserTasks.send(user_id=1, message_id="x", payload="x")
    [message] = receive_due(UserTasks)
    wait_until(lambda: timezone.now() > message.lease_expires_at, timeout=30)
    with pytest.raises(LeaseLost, match="lease lost"):
        api.renew(message)
    assert api.renew_many([message]) == []


def test_release_is_not_supported() -> None:
    from spanner_queues.exceptions import NotSupportedByEngine

    Jobs.send(payload="x")
    [message] = receive_due(Jobs)
    assert not engines["default"].features.supports_release
    with pytest.raises(NotSupportedByEngine):
        api.release(message)


def test_stats_count_by_deliver_time() -> None:
    Jobs.send_many([{"payload": "r"}, {"payload": "r"}, {"payload": "s", "delay": timedelta(1)}])
    receive_due(Jobs)
    stats = engines["default"].stats(Jobs)
    # Spanner does not expose leases: the in-flight message still counts as ready.
    assert (stats.total, stats.ready, stats.leased, stats.scheduled) == (3, 2, 0, 1)
    assert stats.oldest_age is not None and stats.max_attempts is None


def test_dead_letter_round_trip_keeps_key_and_payload() -> None:
    from spanner_queues.deadletter import dead_letter, replay
    from tests.testapp.models import Emails, EmailsDead

    sent = Emails.send(payload={"to": "ada@example.com"})
    dead = dead_letter(receive_due(Emails)[0])
    assert dead.key == sent.key and not Emails.objects.exists()
    assert EmailsDead.objects.get(pk=sent.key[0]).as_message().json() == {"to": "ada@example.com"}
    back = replay(dead)
    assert back.queue == "testapp.Emails" and not EmailsDead.objects.exists()
    assert receive_due(Emails)[0].key == sent.key

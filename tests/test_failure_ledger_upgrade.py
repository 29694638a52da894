"""Upgrading the failure ledger from the previous release's migrations (``0004``): records
written before ``0004`` have no ``leased_at``, which read as every message's (a key with 4 old
failures made a new message's first failure attempt 5, and the prune never removed the
record). Migration ``0005`` gives them a ``leased_at`` that fails closed: the message they were
of keeps its count, a message sent after them inherits none, and the prune removes them once
their message is gone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from spanner_queues import clock
from spanner_queues.failures import (
    FailedDelivery,
    Seen,
    failures_of,
    key_text,
    prune,
    record_failure,
)
from spanner_queues.message import Message
from spanner_queues.semantics import LEASE

pytestmark = pytest.mark.django_db(transaction=True)

PREVIOUS = [("spanner_queues", "0004_failed_delivery_leased_at")]
QUEUE = "testapp.Jobs"


def migrate(targets: list[tuple[str, str]]) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor


def latest() -> list[tuple[str, str]]:
    return MigrationExecutor(connection).loader.graph.leaf_nodes("spanner_queues")


def delivery(key: str, deliver_time, attempt: int = 1) -> Message:
    now = clock.now()
    return Message(
        queue=QUEUE,
        key=(key,),
        key_names=("id",),
        payload=b"x",
        deliver_time=deliver_time,
        attempt=attempt,
        lease_token="t",
        lease_expires_at=now + LEASE,
    )


def test_records_from_before_leased_at_neither_give_nor_lose_a_count_after_the_upgrade() -> None:
    head = latest()
    executor = migrate(PREVIOUS)
    try:
        old = executor.loader.project_state(PREVIOUS).apps.get_model(
            "spanner_queues", "FailedDelivery"
        )
        last_failed = clock.now() - timedelta(hours=3)
        for key in ("live", "sent again", "gone"):
            old.objects.create(  # as the release before 0004 wrote them: no leased_at
                queue=QUEUE,
                message_key=key_text((key,)),
                failures=4,
                last_error="RuntimeError: old",
                updated_at=last_failed,
            )
    finally:
        migrate(head)
    sent_before = last_failed - timedelta(minutes=5)  # the message the records were of
    sent_after = clock.now()  # a message sent again under the key since
    # the message the record was of keeps its 4 failures; one sent after it inherits none
    assert failures_of(
        QUEUE,
        {("live",): Seen(sent_before), ("sent again",): Seen(sent_after)},
        using="default",
    ) == {("live",): 4}
    assert record_failure(delivery("sent again", sent_after), None, using="default") == 1
    assert record_failure(delivery("live", sent_before, 5), None, using="default") == 5
    # the prune removes the record whose message is gone, and keeps the live one's
    stale = list(FailedDelivery.objects.filter(message_key=key_text(("gone",))))
    live = FailedDelivery.objects.get(message_key=key_text(("live",)))
    assert prune([*stale, live], {key_text(("live",)): sent_before}, using="default") == 1
    assert sorted(FailedDelivery.objects.values_list("message_key", "failures")) == [
        (key_text(("live",)), 5),
        (key_text(("sent again",)), 1),
    ]

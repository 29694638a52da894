"""Conformance: ``message.attempt`` counts the deliveries of one sent message. A message sent
under a key whose earlier message failed and was then deleted, on whatever path (acked by key
as the docs show, replaced, deleted through the ORM, deleted by a statement of another program
as a cascade or TTL would), starts at attempt 1: the earlier message's failures are not its,
and with ``max_attempts`` it runs instead of being dead-lettered or discarded unrun."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection, transaction

from spanner_queues import api, clock
from spanner_queues.engines import engine_for
from spanner_queues.message import Message
from spanner_queues.testing.conformance.models import Jobs
from spanner_queues.testing.conformance.support import wait_until
from spanner_queues.worker.apply import DeliveryPolicy

pytestmark = pytest.mark.django_db(transaction=True)

FAILURES = 4


def _receive(key: str) -> Message:
    """The delivery of ``key`` (a message another test left is not this test's)."""
    got: list[Message] = []

    def arrived() -> bool:
        got.extend(m for m in api.receive(Jobs, max_messages=10) if m.key == (key,))
        return bool(got)

    wait_until(arrived, timeout=60)
    return got[0]


def _failed_four_times(key: str) -> Message:
    """Send ``key`` and fail it ``FAILURES`` times as the worker does: where the engine can
    release, four deliveries, each given back due now; elsewhere (native: the message comes
    back only after its lease) four failed runs recorded of one delivery, as the ledger counts
    them. Returns the last delivery, still held."""
    policy = DeliveryPolicy(engine_for(Jobs))
    Jobs.send(id=key, payload="first")
    message = _receive(key)
    for n in range(1, FAILURES + 1):
        failure = policy.fail(Jobs, message, RuntimeError(f"run {n} failed"), using="default")
        assert failure.attempt == n
        if n < FAILURES and policy.give_back(Jobs, message, deliver_time=clock.now()):
            message = _receive(key)
    return message


def _ack_by_key(key: str) -> None:
    api.ack_many(Jobs, [{"id": key}])


def _replace(key: str) -> None:
    api.replace(Jobs, {"id": key}, payload="again")


def _orm_delete(key: str) -> None:
    Jobs.objects.filter(pk=key).delete()


def _foreign_delete(key: str) -> None:
    """A DELETE none of the package's code runs (a cascade, TTL, another program)."""
    table = connection.ops.quote_name(Jobs._meta.db_table)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table} WHERE {connection.ops.quote_name('id')} = %s", [key])


@pytest.mark.parametrize(
    "delete",
    [_ack_by_key, _replace, _orm_delete, _foreign_delete],
    ids=["acked-by-key", "replaced", "orm-delete", "foreign-delete"],
)
def test_a_key_sent_again_after_its_failed_message_was_deleted_starts_at_attempt_1(
    delete: Callable[[str], None],
) -> None:
    key = f"again-{delete.__name__.strip('_')}"
    try:
        _failed_four_times(key)
        delete(key)
        if not Jobs.objects.filter(pk=key).exists():  # (replace sent it already)
            Jobs.send(id=key, payload="again")
        assert _receive(key).attempt == 1
    finally:
        api.stop_receiving(Jobs, wait=10)


def test_the_failures_of_a_message_acked_after_a_failed_run_go_with_it() -> None:
    """Acked by the worker's ack (``ack_many`` with its lease) after a failure: a message sent
    again under the key starts at attempt 1."""
    key = "acked-after-failure"
    try:
        message = _failed_four_times(key)
        with transaction.atomic():
            api.ack(message)
        Jobs.send(id=key, payload="again")
        assert _receive(key).attempt == 1
    finally:
        api.stop_receiving(Jobs, wait=10)

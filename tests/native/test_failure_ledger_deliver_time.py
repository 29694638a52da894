"""The failure ledger under every answer Spanner could give about ``DeliverTime`` on a lease
(``../shared/spec/spanner-queues.md`` §7 leaves it open; the front plays each:
``FrontControl.configure(deliver_time=...)``): kept, moved to the lease's expiry, moved to the
next due time. A failing message with ``max_attempts = 3`` is exhausted at its third failure
under each, and a message sent again under its key starts at attempt 1 where the engine can
tell (the ack of a received message took its record; an envelope's event ``id`` is new per
send)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.db import transaction

from spanner_queues import api
from spanner_queues.deadletter import dead_letter
from spanner_queues.engines import engines
from spanner_queues.engines.native import deliver_time_moved, forget_moved_deliver_times
from spanner_queues.failures import FailedDelivery
from spanner_queues.message import Message
from spanner_queues.testing.conformance.support import receive_due
from spanner_queues.worker.apply import DeliveryPolicy
from spanner_queues_emulator.queues import DELIVER_TIME_MODES
from tests.testapp.models import Emails, EmailsDead
from tests.tracingapp.models import Events

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _fresh_tripwire() -> Iterator[None]:
    """Each test starts with no queue switched to the moved-``DeliverTime`` rule."""
    forget_moved_deliver_times()
    yield
    forget_moved_deliver_times()


def fail_until_exhausted(
    model, key: str, runs: int, last: list[Message] | None = None
) -> list[tuple[int, int | None, bool]]:
    """Receive the message under ``key`` and fail it, ``runs`` times or until exhausted:
    (the delivery's ``attempt``, the attempt the failure counted, exhausted) of each run;
    the last delivery goes to ``last``."""
    policy = DeliveryPolicy(engines["default"])
    seen = []
    for _ in range(runs):
        [message] = receive_due(model, timeout=90)
        assert message.key == (key,)
        attempt = message.attempt  # (read before the failure is recorded)
        failure = policy.fail(model, message, RuntimeError("poison"), using="default")
        seen.append((attempt, failure.attempt, failure.exhausted))
        if last is not None:
            last[:] = [message]
        if failure.exhausted:
            break
    return seen


@pytest.mark.parametrize("mode", DELIVER_TIME_MODES)
def test_a_failing_message_is_exhausted_at_its_third_failure_whatever_a_lease_does_to_deliver_time(
    front, mode: str, caplog
) -> None:
    front.configure(deliver_time=mode)
    Emails.send(id="poison", payload=b"x")
    last: list[Message] = []
    try:
        with caplog.at_level(logging.ERROR, logger="spanner_queues.engines.native"):
            runs = fail_until_exhausted(Emails, "poison", 4, last)
        assert runs == [(1, 1, False), (2, 2, False), (3, 3, True)]
        dead_letter(last[0])  # (what the worker does with an exhausted message)
    finally:
        api.stop_receiving(Emails, wait=10)
    assert list(EmailsDead.objects.values_list("pk", flat=True)) == ["poison"]
    assert not Emails.objects.exists()
    assert not FailedDelivery.objects.exists()  # the record went with the message
    # the tripwire: proof that DeliverTime moves, logged once, counted for each delivery
    moved = mode != "kept"
    assert deliver_time_moved(engines["default"], Emails) is moved
    assert engines["default"].deliver_time_moves(Emails) == (3 if moved else 0)
    errors = [r for r in caplog.records if "moves DeliverTime" in r.getMessage()]
    assert len(errors) == (1 if moved else 0)


@pytest.mark.parametrize("mode", DELIVER_TIME_MODES)
def test_the_prune_keeps_the_record_of_a_failing_message_whatever_a_lease_does_to_deliver_time(
    front, mode: str
) -> None:
    front.configure(deliver_time=mode)
    Emails.send(id="failing", payload=b"x")
    engine = engines["default"]
    try:
        assert fail_until_exhausted(Emails, "failing", 1) == [(1, 1, False)]
        [again] = receive_due(Emails, timeout=90)  # (its DeliverTime moved again, if it moves)
        with transaction.atomic():
            assert engine.prune_failures(Emails, using="default", older_than=timedelta(0)) == 0
        assert again.attempt == 2
    finally:
        api.stop_receiving(Emails, wait=10)


@pytest.mark.parametrize("mode", DELIVER_TIME_MODES)
def test_a_key_acked_after_a_failure_and_sent_again_starts_at_attempt_one(front, mode: str) -> None:
    front.configure(deliver_time=mode)
    Emails.send(id="again", payload=b"x")
    try:
        assert fail_until_exhausted(Emails, "again", 1) == [(1, 1, False)]
        [message] = receive_due(Emails, timeout=90)
        assert message.attempt == 2
        with transaction.atomic():
            api.ack(message)
        Emails.send(id="again", payload=b"y")
        [sent_again] = receive_due(Emails, timeout=90)
        assert sent_again.payload == b"y"
        assert sent_again.attempt == 1
    finally:
        api.stop_receiving(Emails, wait=10)


@pytest.mark.parametrize("mode", DELIVER_TIME_MODES)
def test_an_event_deleted_where_nothing_of_ours_ran_and_sent_again_starts_at_attempt_one(
    front, mode: str
) -> None:
    front.configure(deliver_time=mode)
    Events.send(id="ev", payload={"n": 1})
    policy = DeliveryPolicy(engines["default"])
    try:
        [message] = receive_due(Events, timeout=90)
        policy.fail(Events, message, RuntimeError("1"), using="default")
        Events.objects.filter(pk="ev").delete()  # (as a cascade or TTL: the record stays)
        assert FailedDelivery.objects.filter(queue=Events._meta.label).count() == 1
        Events.send(id="ev", payload={"n": 2})  # a new event: a new id
        [sent_again] = receive_due(Events, timeout=90)
        assert sent_again.json() == {"n": 2}
        assert sent_again.attempt == 1
        assert policy.fail(Events, sent_again, RuntimeError("2"), using="default").attempt == 1
    finally:
        api.stop_receiving(Events, wait=10)

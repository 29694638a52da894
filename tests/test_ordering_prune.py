"""The ordering keys' rows (``ordering.KeySequence``) do not grow with every key ever sent: a
key that sent nothing for ``KEY_RETENTION`` loses its row (``ordering.prune``, which the worker
runs at most hourly per database), and its next send still comes after its messages still
queued. On every engine the suite runs on."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

from spanner_queues import api, clock, ordering
from spanner_queues.engines import engine_for
from spanner_queues.ordering import KeySequence, sequence_id
from spanner_queues.testing.conformance.models import OrderedEvents

pytestmark = pytest.mark.django_db(transaction=True)

LABEL = OrderedEvents._meta.label


def _row(customer: str) -> KeySequence | None:
    return KeySequence.objects.filter(pk=sequence_id(LABEL, [customer])).first()


def test_a_key_quiet_for_a_day_loses_its_row_and_its_next_send_still_comes_after_its_queue() -> (
    None
):
    OrderedEvents.send(customer="quiet", message_id="1")
    OrderedEvents.send(customer="busy", message_id="1")
    first = _row("quiet")
    assert first is not None and first.sent == 1 and first.last_sent is not None
    assert ordering.prune(using="default") == 0  # a day has not passed: both kept
    later = clock.now() + ordering.KEY_RETENTION + timedelta(seconds=1)
    OrderedEvents.send(customer="busy", message_id="2")  # (its row's last send moves on)
    busy = _row("busy")
    assert busy is not None and busy.last_sent is not None
    assert ordering.prune(using="default", now=busy.last_sent + ordering.KEY_RETENTION) == 1
    assert _row("quiet") is None and _row("busy") is not None
    assert ordering.prune(using="default", now=later) <= 1  # (whatever is left of "busy")

    OrderedEvents.send(customer="quiet", message_id="2")  # the key's row starts again
    again = _row("quiet")
    assert again is not None and again.sent == 1 and again.last_sent > first.last_sent
    if engine_for(OrderedEvents).features.supports_ordered_receive:
        # its first message, still queued, is still its head: the second waits for it
        [head] = [m for m in api.receive(OrderedEvents, max_messages=10) if m.key[0] == "quiet"]
        assert head.key_dict["message_id"] == "1"
        assert [m for m in api.receive(OrderedEvents, max_messages=10) if m.key[0] == "quiet"] == []
        api.ack(head)
        [nxt] = [m for m in api.receive(OrderedEvents, max_messages=10) if m.key[0] == "quiet"]
        assert nxt.key_dict["message_id"] == "2"


def test_the_prune_runs_at_most_once_an_interval_and_never_in_a_callers_transaction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ordering, "_prunes", clock.Throttle())
    OrderedEvents.send(customer="old", message_id="1")
    monkeypatch.setattr(ordering, "KEY_RETENTION", timedelta(0))  # every row is past it
    with transaction.atomic():
        ordering.prune_if_due("default")  # inside a transaction: not now
    assert _row("old") is not None
    ordering.prune_if_due("default")
    assert _row("old") is None
    OrderedEvents.send(customer="old", message_id="2")
    ordering.prune_if_due("default")  # within the interval: not again
    assert _row("old") is not None


def test_a_worker_prunes_the_ordering_keys_of_its_databases(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spanner_queues.receivers import ReceiverRegistry, receiver
    from spanner_queues.worker import Worker

    monkeypatch.setattr(ordering, "_prunes", clock.Throttle())
    monkeypatch.setattr(ordering, "KEY_RETENTION", timedelta(0))  # every row is past it
    registry = ReceiverRegistry()
    receiver(OrderedEvents, registry=registry)(lambda message: None)
    OrderedEvents.send(customer="done", message_id="1")
    assert _row("done") is not None
    stats = Worker(
        [OrderedEvents], registry=registry, burst=True, install_signal_handlers=False
    ).run()
    assert stats.processed == 1
    assert _row("done") is None

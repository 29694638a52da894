"""Conformance: ``api.settle_receiving``, which a burst worker asks before it exits. Every
engine says True only once no row is leased to this process and unread: rows a stream's open
call brought before its end are handed out by the next ``receive``, none is left leased."""

from __future__ import annotations

import pytest
from django.db import transaction

from spanner_queues import api
from spanner_queues.testing.conformance.models import Jobs

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_burst_loop_ends_settled_with_every_message_received_and_none_leased() -> None:
    sent = Jobs.send_many([{"payload": str(i)} for i in range(5)])
    api.settle_receiving(Jobs, wait=0)  # as a burst worker does at its start
    got = []
    try:
        while True:  # a burst worker's loop: receive; when nothing comes, settle or go on
            batch = api.receive(Jobs, max_messages=10)
            for message in batch:
                api.ack(message)
            got.extend(batch)
            if not batch and api.settle_receiving(Jobs):
                break
    finally:
        api.stop_receiving(Jobs, wait=10)
    assert sorted(m.key for m in got) == sorted(m.key for m in sent)
    assert not Jobs.objects.exists()


def test_nothing_received_is_settled_at_once() -> None:
    assert api.settle_receiving(Jobs, wait=0) is True


def test_a_burst_loop_that_waits_for_nothing_settles_only_once_every_message_came() -> None:
    """A worker serving several queues receives with ``wait=0``: what is at hand (on a
    streaming engine, what the stream holds now). An empty receive proves nothing; a settle
    is True only once the engine's last look at the queue found nothing due."""
    sent = Jobs.send_many([{"payload": str(i)} for i in range(25)])
    api.settle_receiving(Jobs, wait=0)
    got = []
    try:
        while True:
            batch = api.receive(Jobs, max_messages=1, wait=0)
            for message in batch:
                api.ack(message)
            got.extend(batch)
            if not batch and api.settle_receiving(Jobs):
                break
    finally:
        api.stop_receiving(Jobs, wait=10)
    assert sorted(m.key for m in got) == sorted(m.key for m in sent)
    assert not Jobs.objects.exists()


def test_a_settle_is_not_held_up_by_messages_the_caller_gave_back() -> None:
    """Messages the caller has handled and given back, due again at once (a worker gives back
    those no receiver of its release matches), are passed as ``ignore``: found again, they do
    not keep the caller from settling."""
    sent = Jobs.send(payload="unmatched")
    api.settle_receiving(Jobs, wait=0)
    try:
        for _ in range(10):
            for message in api.receive(Jobs, max_messages=5, wait=0):
                with transaction.atomic():  # given back, due now, under its key
                    api.ack(message)
                    Jobs.send(id=message.key[0], payload="unmatched")
            if api.settle_receiving(Jobs, ignore={sent.key}):
                break
        else:
            pytest.fail("never settled")
    finally:
        api.stop_receiving(Jobs, wait=10)
    assert list(Jobs.objects.values_list("id", flat=True)) == [sent.key[0]]

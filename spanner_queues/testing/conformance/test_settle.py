"""Conformance: ``api.settle_receiving``, which a burst worker asks before it exits. Every
engine says True only once no row is leased to this process and unread: rows a stream's open
call brought before its end are handed out by the next ``receive``, none is left leased."""

from __future__ import annotations

import pytest

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

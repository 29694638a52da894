"""Settling (``settle_receiving``, a ``--burst`` worker's last look) after a row was dropped
unread, under each back-off the front can play (``--backoff``): Google documents the shape of
the back-off after an unread lease, not its curve, so the look that proves the row gone may
come before Spanner hands it back. The engine must not settle while the row is still in the
queue, whatever the curve."""

from __future__ import annotations

from datetime import timedelta

import pytest

from spanner_queues import api
from spanner_queues.engines import engines
from spanner_queues_emulator.answers import BACKOFF_MODES
from tests.testapp.models import UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("backoff", BACKOFF_MODES)
def test_a_burst_loop_takes_a_row_it_dropped_unread_whatever_the_back_off(
    front, backoff: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    front.configure(backoff=backoff)
    UserTasks.send(user_id=1, message_id="dropped", payload="")
    engine = engines["default"]
    # a margin past the whole lease: the first row held is dropped unread, still leased
    monkeypatch.setattr(engine, "lease_margin", timedelta(seconds=30))
    stream = engine._stream(UserTasks)
    got = []
    while stream.lease_expiration_count == 0:
        got += api.receive(UserTasks, wait=0.5)
    assert got == []
    stream._margin = timedelta(seconds=0.5)
    while True:  # a burst worker: take what is held, else settle
        batch = api.receive(UserTasks, max_messages=1, wait=0)
        for message in batch:
            api.ack(message)
        got.extend(m.key for m in batch)
        if not batch and api.settle_receiving(UserTasks, wait=30):
            break
    assert got == [(1, "dropped")]
    assert not UserTasks.objects.exists()

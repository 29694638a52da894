"""The verbs' signals (``spanner_queues.signals``): sent once the writing transaction commits,
with the queue model and the messages; never for a rolled-back one; no commit hook at all
while nobody listens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction

from spanner_queues import api
from spanner_queues.engines import engine_for
from spanner_queues.signals import messages_acked, messages_sent
from tests.testapp.models import Jobs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def heard() -> Iterator[list[tuple[str, Any, list[tuple], str]]]:
    got: list[tuple[str, Any, list[tuple], str]] = []

    def sent(sender: Any, messages: Any, using: str, **kwargs: Any) -> None:
        got.append(("sent", sender, [m.key for m in messages], using))

    def acked(sender: Any, messages: Any, using: str, **kwargs: Any) -> None:
        got.append(("acked", sender, [tuple(m) for m in messages], using))

    messages_sent.connect(sent)
    messages_acked.connect(acked)
    yield got
    messages_sent.disconnect(sent)
    messages_acked.disconnect(acked)


def test_sends_and_acks_are_signalled_when_their_transaction_commits(heard) -> None:
    db = engine_for(Jobs).database
    with transaction.atomic(using=db):
        Jobs.send_many([{"id": "a"}, {"id": "b"}])
        assert heard == []  # not yet committed
    assert heard == [("sent", Jobs, [("a",), ("b",)], db)]
    with pytest.raises(RuntimeError), transaction.atomic(using=db):
        api.ack_many(Jobs, [("a",)])
        raise RuntimeError
    assert len(heard) == 1  # rolled back: nothing
    api.ack_many(Jobs, [("a",), ("b",)])
    assert heard[1:] == [("acked", Jobs, [("a",), ("b",)], db)]


def test_while_nobody_listens_the_verbs_register_no_commit_hook(monkeypatch) -> None:
    for signal in (messages_sent, messages_acked):  # (the metrics app may listen here)
        monkeypatch.setattr(signal, "receivers", [])
        monkeypatch.setattr(signal, "sender_receivers_cache", {})
    db = engine_for(Jobs).database
    with transaction.atomic(using=db):
        Jobs.send(id="a")
        api.ack_many(Jobs, [("a",)])
        assert transaction.get_connection(db).run_on_commit == []

"""What ordering per key (``QueueMeta.ordered_by``) costs the table engine per message, in SQL
statements: a send takes its key's ``KeySequence`` row (UPDATE, a read, UPDATE; an INSERT the
first time a key is sent), a claim and an ack cost the same statements as on an unordered queue
(the claim's ``NOT EXISTS`` runs inside its one SELECT). The figures are in
docs/howto/ordered.md."""

from __future__ import annotations

import re

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from spanner_queues import api
from spanner_queues.testing.conformance.models import OrderedEvents, UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


def statements(action: object) -> list[str]:
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        action()  # type: ignore[operator]
    return [kind for kind in map(verb, captured.captured_queries) if kind]


def verb(query: dict[str, str]) -> str | None:
    """The statement's verb (the first of INSERT, UPDATE, SELECT, DELETE in its text: a
    driver may wrap it); None for transaction control."""
    words = re.findall(r"[A-Z]+", query["sql"].upper())
    return next((w for w in words if w in ("INSERT", "UPDATE", "SELECT", "DELETE")), None)


@pytest.mark.requires("supports_ordered_receive")
def test_an_ordered_send_costs_three_statements_more_once_its_key_was_sent() -> None:
    OrderedEvents.send(customer="c1", message_id="0")
    UserTasks.send(user_id=1, message_id="0")
    plain = statements(lambda: UserTasks.send(user_id=1, message_id="1"))
    ordered = statements(lambda: OrderedEvents.send(customer="c1", message_id="1"))
    assert plain == ["INSERT"]
    assert ordered == ["UPDATE", "SELECT", "UPDATE", "INSERT"]
    first = statements(lambda: OrderedEvents.send(customer="c2", message_id="1"))
    assert first == ["UPDATE", "INSERT", "SELECT", "UPDATE", "INSERT"]


@pytest.mark.requires("supports_ordered_receive")
def test_an_ordered_claim_and_ack_cost_what_an_unordered_one_costs() -> None:
    # (a first receive does whatever pruning an earlier test's sends made due)
    assert api.receive(UserTasks) == api.receive(OrderedEvents) == []
    OrderedEvents.send(customer="c1", message_id="1")
    UserTasks.send(user_id=1, message_id="1")
    got: dict[str, list] = {}

    def claim(queue: object, name: str) -> None:
        got[name] = api.receive(queue, max_messages=10)  # type: ignore[arg-type]

    with CaptureQueriesContext(connection) as plain:
        claim(UserTasks, "plain")
        api.ack(got["plain"][0])
    with CaptureQueriesContext(connection) as ordered:
        claim(OrderedEvents, "ordered")
        api.ack(got["ordered"][0])
    assert len(ordered.captured_queries) == len(plain.captured_queries)

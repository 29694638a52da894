"""A native envelope queue (``QueueMeta.envelope = "cloudevents"``) as another language's
program sees it through Google's plain client: the ``Payload`` column holds the CloudEvent's
structured JSON, and an event a plain client sends is read by a receiver as data and
attributes."""

from __future__ import annotations

import json

import pytest

from spanner_queues import api
from spanner_queues.engines.native.client import database_for
from spanner_queues.testing.conformance.support import receive_due
from tests.tracingapp.models import Events

pytestmark = pytest.mark.django_db(transaction=True)


def test_googles_plain_client_reads_the_stored_cloudevent() -> None:
    Events.send(id="g1", payload={"order": 7}, event={"type": "shop.order.paid", "subject": "7"})
    with database_for("default").snapshot() as snapshot:
        rows = list(snapshot.execute_sql(f"SELECT id, Payload FROM {Events._meta.db_table}"))
    [(key, payload)] = rows
    event = json.loads(payload.serialize())  # a JSON column: google's JsonObject
    assert key == "g1"
    assert event["specversion"] == "1.0" and event["type"] == "shop.order.paid"
    assert event["subject"] == "7" and event["data"] == {"order": 7}
    assert event["datacontenttype"] == "application/json" and event["id"]
    [message] = receive_due(Events)
    api.ack(message)


def test_an_event_a_plain_client_sends_is_read_as_data_and_attributes() -> None:
    event = {
        "specversion": "1.0",
        "id": "go-1",
        "source": "https://billing.example.com",
        "type": "com.example.invoice.issued",
        "datacontenttype": "application/json",
        "data": {"invoice": 12},
    }
    with database_for("default").batch() as batch:
        batch.send(queue=Events._meta.db_table, key=["from-go"], payload=json.dumps(event))
    [message] = receive_due(Events)
    assert message.json() == {"invoice": 12}
    assert message.event == {k: v for k, v in event.items() if k != "data"}
    api.ack(message)

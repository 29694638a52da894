"""``QueueMeta.envelope = "cloudevents"``: each message stored as CloudEvents 1.0 structured
JSON around its payload; receivers read the data as ``payload`` and the attributes as
``event``; queues without it keep the raw payload. Runs on every engine."""

from __future__ import annotations

import base64
import json
import re

import pytest
from django.db import transaction

from spanner_queues import api
from spanner_queues.exceptions import InvalidMessage, QueueConfigurationError
from spanner_queues.testing.conformance.support import receive_due
from tests.tracingapp.models import BytesEvents, Events, Order, OrderEvents, RawEvents, TextEvents

pytestmark = pytest.mark.django_db(transaction=True)

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def stored(model, key: str) -> dict:
    """The event as the queue stores it, read from the row."""
    return json.loads(_row_payload(model, key))


def _row_payload(model, key: str) -> bytes:
    row = model.objects.filter(pk=key).values_list("payload", flat=True).get()
    if isinstance(row, str):
        return row.encode()
    if isinstance(row, (bytes, memoryview)):
        return bytes(row)
    return json.dumps(row).encode()  # (a JSON column read as a value)


def test_an_envelope_queue_stores_a_cloudevent_and_a_receiver_reads_its_data() -> None:
    sent = Events.send(id="e1", payload={"order": 7, "items": ["a"]})
    event = stored(Events, "e1")
    assert set(event) == {"specversion", "id", "source", "type", "time", "datacontenttype", "data"}
    assert event["specversion"] == "1.0"
    assert re.fullmatch(r"[0-9a-f]{32}", event["id"])
    assert event["source"] == "/spanner_queues/tracingapp.Events"
    assert event["type"] == "tracingapp.events"
    assert TIME.match(event["time"]), event["time"]
    assert event["datacontenttype"] == "application/json"
    assert event["data"] == {"order": 7, "items": ["a"]}
    assert sent.json() == {"order": 7, "items": ["a"]}

    [message] = receive_due(Events)
    assert message.json() == {"items": ["a"], "order": 7}
    assert message.payload == b'{"items":["a"],"order":7}'  # as a raw json queue holds it
    assert message.event == {k: v for k, v in event.items() if k != "data"}
    assert json.loads(message.stored_payload) == event
    api.ack(message)


def test_every_send_gets_a_new_event_id() -> None:
    Events.send(id="a", payload={})
    Events.send(id="b", payload={})
    assert stored(Events, "a")["id"] != stored(Events, "b")["id"]


def test_type_and_subject_come_from_the_send_and_source_from_the_setting(settings) -> None:
    settings.SPANNER_QUEUES_EVENT_SOURCE = "https://shop.example.com/orders"
    Events.send(id="s", payload=1, event={"type": "com.example.order.paid", "subject": 42})
    event = stored(Events, "s")
    assert (event["type"], event["subject"], event["source"]) == (
        "com.example.order.paid",
        "42",
        "https://shop.example.com/orders",
    )


def test_other_attributes_cannot_be_set_and_raw_queues_take_no_event() -> None:
    with pytest.raises(InvalidMessage, match="'id'"):
        Events.send(id="x", payload=1, event={"id": "mine"})
    with pytest.raises(InvalidMessage, match="envelope queues"):
        RawEvents.send(id="x", payload=1, event={"type": "t"})
    assert not Events.objects.exists() and not RawEvents.objects.exists()


def test_a_queue_without_envelope_stores_the_raw_payload() -> None:
    RawEvents.send(id="r", payload={"order": 7})
    assert json.loads(_row_payload(RawEvents, "r")) == {"order": 7}
    [message] = receive_due(RawEvents)
    assert message.event is None and message.stored_payload == message.payload
    api.ack(message)


def test_bytes_travel_as_data_base64_and_text_as_text_plain() -> None:
    blob = bytes(range(256))
    BytesEvents.send(id="b", payload=blob)
    event = stored(BytesEvents, "b")
    assert event["datacontenttype"] == "application/octet-stream"
    assert base64.b64decode(event["data_base64"]) == blob and "data" not in event
    [message] = receive_due(BytesEvents)
    assert message.payload == blob
    api.ack(message)

    TextEvents.send(id="t", payload="héllo")
    event = stored(TextEvents, "t")
    assert (event["datacontenttype"], event["data"]) == ("text/plain", "héllo")
    [message] = receive_due(TextEvents)
    assert message.text() == "héllo"
    api.ack(message)


def test_the_outbox_fills_type_and_subject_from_the_model_change() -> None:
    with transaction.atomic():
        order = Order.objects.create(total=5)
    [message] = receive_due(OrderEvents)
    assert message.event["type"] == "tracingapp.order.created"
    assert message.event["subject"] == str(order.pk)
    assert message.json() == {"model": "tracingapp.order", "pk": order.pk, "event": "created"}
    api.ack(message)
    pk = order.pk
    with transaction.atomic():
        order.delete()
    [message] = receive_due(OrderEvents)
    assert (message.event["type"], message.event["subject"]) == (
        "tracingapp.order.deleted",
        str(pk),
    )
    api.ack(message)


def test_a_retry_resends_the_same_stored_event() -> None:
    from datetime import timedelta

    from spanner_queues.exceptions import Retry
    from spanner_queues.receivers import ReceiverRegistry, receiver
    from spanner_queues.worker import Worker

    Events.send(id="r", payload={"n": 1})
    first = stored(Events, "r")
    registry = ReceiverRegistry()
    runs: list[dict] = []

    @receiver("tracingapp.Events", registry=registry)
    def handle(message):
        runs.append(message.event)
        if len(runs) == 1:
            raise Retry(after=timedelta(0))

    Worker(
        ["tracingapp.Events"], registry=registry, burst=True, install_signal_handlers=False
    ).run()
    assert [r["id"] for r in runs] == [first["id"], first["id"]]
    assert not Events.objects.exists()


def test_an_unknown_envelope_is_a_configuration_error() -> None:
    from django.db import models

    from spanner_queues.models import Queue

    with pytest.raises(QueueConfigurationError, match="'avro'"):

        class Wrong(Queue):
            id = models.CharField(max_length=8, primary_key=True)

            class QueueMeta:
                envelope = "avro"

            class Meta:
                app_label = "tracingapp"


def test_a_renewed_message_keeps_its_event() -> None:
    Events.send(id="n", payload={"n": 1})
    [message] = receive_due(Events)
    renewed = api.renew(message)
    assert renewed.stored_payload == message.stored_payload
    assert renewed.json() == {"n": 1} and renewed.event == message.event
    api.ack(renewed)


def test_a_key_field_named_event_is_a_key_field_on_a_queue_without_envelope() -> None:
    from tests.tracingapp.models import KeyedByEvent

    sent = KeyedByEvent.send(event="e1", payload=b"x")
    assert sent.key == ("e1",) and sent.payload == b"x"

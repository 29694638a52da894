"""Conformance: payload types. A queue declares ``QueueMeta.payload_type`` ("bytes", the
default, "string" or "json"); every engine stores that type and returns the same
``Message.payload`` bytes for it (UTF-8 text; canonical JSON for "json")."""

from __future__ import annotations

import pytest
from django.db import models

from spanner_queues.exceptions import PayloadError
from spanner_queues.models import JSONPayloadField
from spanner_queues.payload import payload_type
from spanner_queues.testing.conformance.models import Greetings, JsonEvents, UserTasks
from spanner_queues.testing.conformance.support import receive_due

pytestmark = pytest.mark.django_db(transaction=True)


def test_declared_payload_types_choose_the_payload_field() -> None:
    assert payload_type(UserTasks) == "bytes"
    assert isinstance(UserTasks._meta.get_field("payload"), models.BinaryField)
    assert payload_type(Greetings) == "string"
    field = Greetings._meta.get_field("payload")
    assert type(field) is models.TextField and field.column == "Payload"
    assert payload_type(JsonEvents) == "json"
    assert isinstance(JsonEvents._meta.get_field("payload"), JSONPayloadField)


def test_string_payload_round_trip() -> None:
    Greetings.send_many(
        [
            {"id": 1, "payload": "héllo wörld"},
            {"id": 2, "payload": b"utf-8 bytes \xc3\xa9"},
            {"id": 3, "payload": {"kind": "json text"}},
        ]
    )
    got = {m.key[0]: m for m in receive_due(Greetings, 3, max_messages=10)}
    assert got[1].payload == "héllo wörld".encode() and got[1].text() == "héllo wörld"
    assert got[2].text() == "utf-8 bytes é"
    assert got[3].json() == {"kind": "json text"}
    # The ORM reads the stored STRING as text: nothing is base64-encoded or bytes.
    assert Greetings.objects.get(pk=1).payload == "héllo wörld"
    assert Greetings.objects.get(pk=1).as_message().payload == "héllo wörld".encode()


def test_string_payload_must_be_utf8() -> None:
    with pytest.raises(PayloadError, match="UTF-8"):
        Greetings.send(id=9, payload=b"\xff\xfe")
    assert not Greetings.objects.exists()


def test_json_payload_round_trip_is_canonical_json() -> None:
    JsonEvents.send(id="obj", payload={"b": [1, 2.5, None], "a": "é"})
    JsonEvents.send(id="str", payload="just a string")
    JsonEvents.send(id="text", payload=b'{ "z" : true,  "y": {} }')
    JsonEvents.send(id="null", payload=None)
    got = {m.key[0]: m for m in receive_due(JsonEvents, 4, max_messages=10)}
    # Keys sorted, no spaces, UTF-8: the same bytes on every engine.
    assert got["obj"].payload == '{"a":"é","b":[1,2.5,null]}'.encode()
    assert got["obj"].json() == {"a": "é", "b": [1, 2.5, None]}
    assert got["str"].json() == "just a string"  # a str is a JSON string value
    assert got["text"].payload == b'{"y":{},"z":true}'  # bytes are JSON text
    assert got["null"].json() is None
    row = JsonEvents.objects.get(pk="obj")
    assert row.payload == '{"a":"é","b":[1,2.5,null]}'
    assert row.as_message().json() == {"a": "é", "b": [1, 2.5, None]}


def test_json_payload_bytes_must_be_json() -> None:
    with pytest.raises(PayloadError, match="not JSON"):
        JsonEvents.send(id="bad", payload=b"not json")
    with pytest.raises(PayloadError):
        JsonEvents.send(id="nan", payload=float("nan"))
    assert not JsonEvents.objects.exists()

"""The CloudEvents envelope, opt-in per queue (``QueueMeta.envelope = "cloudevents"``).

An envelope queue stores each message as one CloudEvents 1.0 event in the structured JSON
format (``application/cloudevents+json``), readable by any CloudEvents SDK or a plain JSON
parser in another language::

    {"data": {"order": 7}, "datacontenttype": "application/json",
     "id": "4f0c...", "source": "https://shop.example.com", "specversion": "1.0",
     "subject": "7", "time": "2026-12-02T02:10:00.123456Z", "type": "shop.order.created",
     "traceparent": "00-...-...-01"}

- ``id``: a new UUID4 (hex) for every send, so a ``Retry``'s re-send keeps it (it is the same
  stored event) and every other send has its own.

A relayed queue (``QueueMeta.pubsub_topic``) without an envelope stores the same event
(``RELAYED``): its ``id`` is the relay's event id, one per send; the relay publishes its data.
- ``source``: the setting ``SPANNER_QUEUES_EVENT_SOURCE`` (a URI-reference), else
  ``/spanner_queues/<queue label>``.
- ``type``: ``event={"type": ...}`` in the send, else the outbox's
  ``<app_label>.<model_name>.<created|updated|deleted>``, else the queue label in lower case.
- ``subject``: ``event={"subject": ...}``, else the outbox's model pk as text; absent otherwise.
- ``data``: the payload: a JSON value (``application/json``); text on a string queue
  (``text/plain``); bytes sent to a bytes queue as ``data_base64``
  (``application/octet-stream``).
- ``traceparent``/``tracestate`` (the distributed-tracing extension) when sent in a span of the
  installed ``spanner_queues.contrib.tracing`` app.

On receive, ``Message.payload`` (and ``json()``) is the event's data encoded as the queue's
payload type would store it, and ``Message.event`` its other attributes. Queues without an
envelope store the raw payload, as always, and carry no trace context.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from django.conf import settings

from spanner_queues.exceptions import InvalidMessage, PayloadError, QueueConfigurationError
from spanner_queues.payload import BYTES, JSON, STRING, decode_json, encode_payload

CLOUDEVENTS = "cloudevents"
#: what ``QueueMeta.envelope`` accepts
ENVELOPES = (CLOUDEVENTS,)
#: the envelope of a relayed queue (``QueueMeta.pubsub_topic``) that declares none: stored as
#: a CloudEvent too, so that each send has its own ``id`` (the relay's event id), but the relay
#: publishes the data alone, as a raw queue's payload
RELAYED = "relayed"
#: attributes a sender may set through ``event={...}`` (the others are the envelope's own)
SETTABLE = frozenset({"type", "subject"})
#: the distributed-tracing extension's attributes, filled from the tracing app's carrier
TRACE_ATTRIBUTES = ("traceparent", "tracestate")
#: characters of ``tracestate`` an envelope stores at most (W3C Trace Context: at least 512 are
#: to be propagated): trace context never eats much of a message's payload budget
TRACESTATE_BUDGET = 512
#: a ``tracestate`` entry longer than this goes first when it must be cut (W3C's rule)
_LONG_TRACESTATE_ENTRY = 128

#: queue label -> envelope of every declared envelope queue (filled as queue classes are made)
_queues: dict[str, str] = {}


def check_envelope(label: str, envelope: Any) -> str | None:
    """Validate ``QueueMeta.envelope``; ``QueueConfigurationError`` says what is accepted."""
    if envelope is None:
        return None
    if envelope not in ENVELOPES:
        raise QueueConfigurationError(
            f"{label}: QueueMeta.envelope {envelope!r} is not None or 'cloudevents'."
        )
    return str(envelope)


def declare(label: str, envelope: str | None) -> None:
    """Record that queue ``label`` stores ``envelope`` (None: the raw payload)."""
    if envelope is None:
        _queues.pop(label, None)
    else:
        _queues[label] = envelope


def envelope_of(label: str) -> str | None:
    return _queues.get(label)


def default_source(label: str) -> str:
    source = getattr(settings, "SPANNER_QUEUES_EVENT_SOURCE", None)
    return str(source) if source else f"/spanner_queues/{label}"


def bounded_tracestate(value: str, budget: int = TRACESTATE_BUDGET) -> str:
    """``value`` cut to ``budget`` characters as W3C Trace Context says a ``tracestate`` is
    truncated: entries longer than 128 characters are dropped first, then entries from the end
    (the right), whole entries only; "" when none is left."""
    if len(value) <= budget:
        return value
    entries = [e.strip() for e in value.split(",") if e.strip()]
    entries = [e for e in entries if len(e) <= _LONG_TRACESTATE_ENTRY]
    while entries and len(",".join(entries)) > budget:
        entries.pop()
    return ",".join(entries)


def wrap(
    payload: Any,
    *,
    label: str,
    payload_type: str,
    event: Mapping[str, Any] | None,
    carrier: Mapping[str, str] | None,
    now: datetime,
    max_bytes: int | None,
    encoder: type[json.JSONEncoder] | None,
) -> bytes:
    """The stored bytes of one CloudEvent around ``payload``; ``InvalidMessage`` for an
    attribute a sender may not set, ``PayloadError``/``PayloadTooLarge`` as for a raw payload
    (the limit counts the whole event)."""
    attributes: dict[str, Any] = {
        "specversion": "1.0",
        "id": uuid.uuid4().hex,
        "source": default_source(label),
        "type": label.lower(),
        "time": _rfc3339(now),
    }
    if event:
        wrong = sorted(set(event) - SETTABLE)
        if wrong:
            raise InvalidMessage(
                f"{label}: event attributes {wrong!r} cannot be set; only 'type' and 'subject'."
            )
        for name, value in event.items():
            if value is not None:
                attributes[name] = str(value)
    if carrier:
        for name in TRACE_ATTRIBUTES:
            value = carrier.get(name)
            if name == "tracestate" and value:
                value = bounded_tracestate(value)
            if value:
                attributes[name] = value
    if isinstance(payload, (bytes, bytearray, memoryview)) and payload_type == BYTES:
        attributes["datacontenttype"] = "application/octet-stream"
        attributes["data_base64"] = base64.b64encode(bytes(payload)).decode("ascii")
    elif isinstance(payload, str) and payload_type in (BYTES, STRING):
        attributes["datacontenttype"] = "text/plain"
        attributes["data"] = payload
    else:
        data = encode_payload(payload, payload_type=JSON, encoder=encoder)
        attributes["datacontenttype"] = "application/json"
        attributes["data"] = json.loads(data)
    return encode_payload(
        attributes,
        payload_type=JSON if payload_type == BYTES else payload_type,
        max_bytes=max_bytes,
        encoder=encoder,
    )


def _rfc3339(moment: datetime) -> str:
    """``moment`` in UTC as RFC 3339 (a naive one, with ``USE_TZ = False``, is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


#: the canonical form of a stored event with JSON data (keys sorted: ``data`` first, then
#: ``datacontenttype``), which ``open_event`` opens without parsing the data
_JSON_DATA_HEAD = b'{"data":'
_JSON_DATA_TAIL = b',"datacontenttype":"application/json",'


def open_event(stored: bytes) -> tuple[bytes, dict[str, Any]]:
    """``(payload, attributes)`` of a stored event: the data as a raw queue would hold it,
    and every other attribute. Stored bytes that are no CloudEvent (a row written before the
    queue had its envelope) come back as they are, with no attributes.

    An event with JSON data stored in canonical form (what a bytes or JSON queue stores) is
    opened by its attributes alone: its data is the canonical JSON a raw queue would hold, as
    stored, so it is cut out, not parsed and encoded again (the relay's cost a message). Only
    the attributes' ``,"datacontenttype"`` can end the data: inside a JSON string every quote
    is escaped, and after the data come only string attributes."""
    if stored.startswith(_JSON_DATA_HEAD):
        cut = stored.rfind(_JSON_DATA_TAIL)
        if cut > 0:
            try:
                attributes = json.loads(b"{" + stored[cut + 1 :])
            except ValueError:
                attributes = None
            if (
                isinstance(attributes, dict)
                and attributes.get("specversion") == "1.0"
                and "data" not in attributes
                and "data_base64" not in attributes
            ):
                return stored[len(_JSON_DATA_HEAD) : cut], attributes
    return _open_parsed(stored)


def _open_parsed(stored: bytes) -> tuple[bytes, dict[str, Any]]:
    """``open_event`` by parsing the whole event."""
    try:
        event = decode_json(stored)
    except PayloadError:
        return stored, {}
    if not isinstance(event, dict) or event.get("specversion") != "1.0":
        return stored, {}
    attributes = {k: v for k, v in event.items() if k not in ("data", "data_base64")}
    if "data_base64" in event:
        return base64.b64decode(event["data_base64"]), attributes
    data = event.get("data")
    if event.get("datacontenttype") == "text/plain" and isinstance(data, str):
        return data.encode("utf-8"), attributes
    return encode_payload(data, payload_type=JSON), attributes

"""Payload encoding and payload types.

A queue's payload type is that of its ``payload`` field, chosen with
``QueueMeta.payload_type``: ``"bytes"`` (the default, ``BYTES(MAX)``), ``"string"``
(``STRING(MAX)``) or ``"json"`` (``JSON`` on native queues). Every message's payload travels
as bytes (``OutgoingMessage.payload``, ``Message.payload``):

- bytes: bytes pass through, str is UTF-8, anything else is compact UTF-8 JSON;
- string: the same, but the bytes must be UTF-8 text;
- json: bytes are JSON text, any other value (a str too) is serialised as JSON; either way the
  result is canonical JSON (keys sorted, no spaces, UTF-8), so every engine returns the same
  bytes for it.

JSON is written by one encoder everywhere (``send``, the outbox, the helpers): the engine's
``JSON_ENCODER`` option, by default Django's ``DjangoJSONEncoder`` (datetimes, dates, times,
timedeltas, Decimals, UUIDs and lazy strings as the serializers write them); NaN and infinities
are refused.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import TYPE_CHECKING, Any, cast

from django.core.serializers.json import DjangoJSONEncoder

from spanner_queues.exceptions import PayloadError, PayloadTooLarge, QueueConfigurationError

if TYPE_CHECKING:
    from django.db import models

BYTES, STRING, JSON = "bytes", "string", "json"
PAYLOAD_TYPES = (BYTES, STRING, JSON)
#: the JSON encoder used when an engine configures none (``OPTIONS["JSON_ENCODER"]``)
DEFAULT_JSON_ENCODER: type[json.JSONEncoder] = DjangoJSONEncoder


def _dumps(value: Any, *, canonical: bool, encoder: type[json.JSONEncoder] | None = None) -> bytes:
    try:
        # (a class is hashable; mypy checks JSONEncoder's instance __hash__ against Hashable)
        return (
            _json_encoder(encoder or DEFAULT_JSON_ENCODER, canonical)  # type: ignore[arg-type]
            .encode(value)
            .encode("utf-8")
        )
    except RecursionError as exc:
        raise _too_deep(value) from exc
    except (TypeError, ValueError, OverflowError) as exc:
        # (UnicodeEncodeError is a ValueError: a lone surrogate in a string of the JSON)
        raise PayloadError(
            f"Payload of type {type(value).__name__} is not bytes, str or JSON-serialisable: {exc}"
        ) from exc


def _too_deep(value: Any) -> PayloadError:
    """The error for JSON nested deeper than Python's recursion limit lets it be read or
    written (``RecursionError`` inside ``json``)."""
    return PayloadError(
        f"Payload ({type(value).__name__}) is JSON nested too deeply to encode or decode "
        f"(deeper than about {sys.getrecursionlimit()} levels); flatten it."
    )


@functools.cache
def _json_encoder(cls: type[json.JSONEncoder], canonical: bool) -> json.JSONEncoder:
    """One encoder instance per class and form (what ``json.dumps(cls=...)`` builds on every
    call; ``encode`` keeps no state between calls)."""
    return cls(separators=(",", ":"), ensure_ascii=False, allow_nan=False, sort_keys=canonical)


def canonical_json(text: bytes | str) -> bytes:
    """JSON text in canonical form (keys sorted, no spaces, UTF-8); ``PayloadError`` if it is
    not JSON."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        text = bytes(text)
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError as exc:
        raise _too_deep(text) from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise PayloadError(f"Payload is not JSON: {exc}") from exc
    return _dumps(value, canonical=True)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_payload_type(payload_type: str) -> str:
    if payload_type not in PAYLOAD_TYPES:
        raise QueueConfigurationError(
            f"payload_type {payload_type!r} is not 'bytes', 'string' or 'json'."
        )
    return payload_type


def encode_payload(
    payload: Any,
    *,
    payload_type: str = BYTES,
    max_bytes: int | None = None,
    encoder: type[json.JSONEncoder] | None = None,
) -> bytes:
    """The bytes stored for ``payload`` in a queue of ``payload_type``; ``PayloadError`` is
    raised before anything is written. Values other than bytes and str are written as JSON
    with ``encoder`` (default ``DjangoJSONEncoder``)."""
    check_payload_type(payload_type)
    if payload_type == JSON:
        if isinstance(payload, (bytes, bytearray, memoryview)):
            data = canonical_json(payload)
        else:
            data = _dumps(payload, canonical=True, encoder=encoder)
    elif isinstance(payload, (bytes, bytearray, memoryview)):
        data = bytes(payload)
        if payload_type == STRING:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise PayloadError(
                    f"A string queue's payload must be UTF-8 text; these bytes are not: {exc}"
                ) from exc
    elif isinstance(payload, str):
        try:
            data = payload.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise PayloadError(f"Payload is not valid Unicode text (UTF-8): {exc}") from exc
    else:
        data = _dumps(payload, canonical=False, encoder=encoder)
    if max_bytes is not None and len(data) > max_bytes:
        raise PayloadTooLarge(
            f"Payload is {len(data)} bytes; the limit is {max_bytes} (MAX_PAYLOAD_BYTES). "
            "Keep messages small and store large data in a table the message points to."
        )
    return data


def decode_json(data: bytes) -> Any:
    """Parse a payload as JSON; raise ``PayloadError`` with the reason if it is not JSON."""
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError as exc:
        raise _too_deep(data) from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise PayloadError(f"Payload is not JSON: {exc}") from exc


def field_payload_type(field: models.Field) -> str:
    """The payload type a ``payload`` field stores: ``BinaryField`` -> bytes, the JSON payload
    field -> json, ``TextField``/``CharField`` -> string; ``QueueConfigurationError`` else."""
    declared = getattr(field, "queue_payload_type", None)
    if declared is not None:
        return str(declared)
    internal = field.get_internal_type()
    if internal == "BinaryField":
        return BYTES
    if internal in ("TextField", "CharField"):
        return STRING
    raise QueueConfigurationError(
        f"The payload field is a {type(field).__name__}; a queue's payload is a BinaryField "
        "(bytes), a TextField (string) or spanner_queues.models.JSONPayloadField (json): "
        "declare QueueMeta.payload_type instead of the field."
    )


def payload_type(model: type[models.Model]) -> str:
    """The payload type of queue ``model`` (of its ``payload`` field, so historical models in
    migrations have it too)."""
    # cast: the payload column is a concrete field (keys.column_field, which imports this)
    return field_payload_type(cast("models.Field", model._meta.get_field("payload")))


def stored_text(payload: bytes) -> str:
    """The text stored in a STRING or JSON column for encoded ``payload``."""
    return payload.decode("utf-8")


def json_value_text(value: Any) -> bytes:
    """Canonical JSON text of a JSON column value as a driver returns it: text, or an object
    with ``serialize()`` (google-cloud-spanner's ``JsonObject``; JSON ``null`` serialises to
    None), or plain Python values."""
    if value is None:
        return b"null"
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return canonical_json(value)
    serialize = getattr(value, "serialize", None)
    if serialize is not None:
        text = serialize()
        return canonical_json("null" if text is None else text)
    return _dumps(value, canonical=True)


def from_stored(value: Any) -> bytes:
    """``Message.payload`` for a stored payload value: bytes as they are, text as UTF-8."""
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)

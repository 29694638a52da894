"""Payload encoding: bytes pass through, str is UTF-8, anything else is compact UTF-8 JSON.

JSON is written by one encoder everywhere (``send``, the outbox, the helpers): the engine's
``JSON_ENCODER`` option, by default Django's ``DjangoJSONEncoder`` (datetimes, dates, times,
timedeltas, Decimals, UUIDs and lazy strings as the serializers write them).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from spanner_queues.exceptions import PayloadError, PayloadTooLarge

#: the JSON encoder used when an engine configures none (``OPTIONS["JSON_ENCODER"]``)
DEFAULT_JSON_ENCODER: type[json.JSONEncoder] = DjangoJSONEncoder


def encode_payload(
    payload: Any,
    *,
    max_bytes: int | None = None,
    encoder: type[json.JSONEncoder] | None = None,
) -> bytes:
    """The bytes stored for ``payload``; ``PayloadError`` is raised before anything is written.
    Anything but bytes and str is written as JSON with ``encoder`` (default
    ``DjangoJSONEncoder``); NaN and infinities are refused."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        data = bytes(payload)
    elif isinstance(payload, str):
        try:
            data = payload.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise PayloadError(f"Payload is not valid Unicode text (UTF-8): {exc}") from exc
    else:
        try:
            data = json.dumps(
                payload,
                cls=encoder or DEFAULT_JSON_ENCODER,
                separators=(",", ":"),
                ensure_ascii=False,
                allow_nan=False,
            ).encode("utf-8")
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            # (UnicodeEncodeError is a ValueError: a lone surrogate in a string of the JSON)
            raise PayloadError(
                f"Payload of type {type(payload).__name__} is not bytes, str or "
                f"JSON-serialisable: {exc}"
            ) from exc
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
    except (UnicodeDecodeError, ValueError) as exc:
        raise PayloadError(f"Payload is not JSON: {exc}") from exc

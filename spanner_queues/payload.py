"""Payload encoding: bytes pass through, str is UTF-8, anything else is compact UTF-8 JSON."""

from __future__ import annotations

import json
from typing import Any

from spanner_queues.exceptions import PayloadError, PayloadTooLarge


def encode_payload(payload: Any, *, max_bytes: int | None = None) -> bytes:
    """The bytes stored for ``payload``; ``PayloadError`` is raised before anything is written."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        data = bytes(payload)
    elif isinstance(payload, str):
        data = payload.encode("utf-8")
    else:
        try:
            data = json.dumps(
                payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False
            ).encode("utf-8")
        except (TypeError, ValueError) as exc:
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

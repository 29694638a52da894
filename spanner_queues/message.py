"""Value objects that cross the engine seam. All are frozen: a renewal returns a new Message."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

from spanner_queues.payload import decode_json

#: the latest deliver time accepted: leases and back-off are added to it, and every database
#: stores it (Spanner's TIMESTAMP ends at 9999-12-31)
LATEST_DELIVER_TIME = datetime(9000, 1, 1, tzinfo=dt_timezone.utc)


@dataclass(frozen=True, slots=True, kw_only=True)
class OutgoingMessage:
    """A message about to be sent: key column values by field name, encoded payload."""

    key: dict[str, Any]
    payload: bytes
    deliver_time: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """A received (leased) or listed message.

    ``key`` holds the key values in primary-key order, ``key_names`` the matching field names.
    ``payload`` is bytes for every payload type, the same on every engine: the stored bytes
    of a bytes queue, the UTF-8 text of a string queue, canonical JSON text (keys sorted, no
    spaces) of a json queue; ``text()`` and ``json()`` decode it.
    ``attempt`` counts deliveries, this one included (0 for a message never delivered).
    ``lease_token`` and ``lease_expires_at`` are set while the message is leased to a receiver.
    """

    queue: str
    key: tuple[Any, ...]
    key_names: tuple[str, ...]
    payload: bytes
    deliver_time: datetime | None
    attempt: int = 0
    lease_token: str | None = None
    lease_expires_at: datetime | None = None
    send_time: datetime | None = None

    @property
    def key_dict(self) -> dict[str, Any]:
        return dict(zip(self.key_names, self.key, strict=True))

    def json(self) -> Any:
        """The payload parsed as JSON; ``PayloadError`` if it is not JSON."""
        return decode_json(self.payload)

    def text(self) -> str:
        """The payload decoded as UTF-8."""
        return self.payload.decode("utf-8")

    def __str__(self) -> str:
        key = ", ".join(f"{n}={v!r}" for n, v in zip(self.key_names, self.key, strict=True))
        return f"{self.queue}({key})"

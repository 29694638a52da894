"""Value objects that cross the engine seam. All are frozen: a renewal returns a new Message."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from datetime import timezone as dt_timezone
from typing import Any

from spanner_queues.envelope import envelope_of, open_event
from spanner_queues.payload import decode_json

__all__ = ["Message", "OutgoingMessage"]

#: the latest deliver time accepted: leases and back-off are added to it, and every database
#: stores it (Spanner's TIMESTAMP ends at 9999-12-31)
LATEST_DELIVER_TIME = datetime(9000, 1, 1, tzinfo=dt_timezone.utc)

logger = logging.getLogger("spanner_queues")


class AttemptLoader:
    """The attempt numbers of one received batch, read on demand: ``load(keys)`` returns the
    attempt of each key it knows (keys it leaves out are first deliveries, attempt 1); it is
    called at most once, for every key of the batch, when the first ``attempt`` of the batch
    is read. A load that fails leaves every attempt of the batch ``None`` (unknown)."""

    __slots__ = ("_keys", "_load", "_loaded")

    def __init__(
        self,
        keys: Sequence[tuple[Any, ...]],
        load: Callable[[Sequence[tuple[Any, ...]]], dict[tuple[Any, ...], int]],
    ) -> None:
        self._keys = list(keys)
        self._load = load
        self._loaded: dict[tuple[Any, ...], int] | None = None

    def attempt(self, key: tuple[Any, ...]) -> int | None:
        if self._loaded is None:
            try:
                self._loaded = self._load(self._keys)
            except Exception:
                logger.warning(
                    "reading the attempts of %d message(s) failed; unknown",
                    len(self._keys),
                    exc_info=True,
                )
                return None
        return self._loaded.get(tuple(key), 1)


class _AttemptField:
    """``Message.attempt``: an int, None, or an ``AttemptLoader`` resolved on first read."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return 0  # the field's default
        value = obj.__dict__.get(self._slot, 0)
        if isinstance(value, AttemptLoader):
            resolved = value.attempt(obj.key)
            if resolved is not None:  # (unknown: asked again on the next read)
                obj.__dict__[self._slot] = resolved
            return resolved
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self._slot] = value


class _PayloadField:
    """``Message.payload``: the stored bytes, or on an envelope queue the event's data, opened
    on first read (``Message.event`` holds the other attributes); ``Message.stored_payload``
    is always the stored bytes."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._slot = f"_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return b""  # the field's default
        opened = obj.__dict__.get("_opened")
        if opened is None:
            opened = _open(obj)
        return opened[0]

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self._slot] = value
        obj.__dict__.pop("_opened", None)


def _open(message: Any) -> tuple[bytes, dict[str, Any] | None]:
    stored = message.__dict__.get("_payload", b"")
    if envelope_of(message.queue) is None:
        opened: tuple[bytes, dict[str, Any] | None] = (stored, None)
    else:
        opened = open_event(stored)
    message.__dict__["_opened"] = opened
    return opened


@dataclass(frozen=True, slots=True, kw_only=True)
class OutgoingMessage:
    """A message about to be sent: key column values by field name, encoded payload."""

    key: dict[str, Any]
    payload: bytes
    deliver_time: datetime | None = None
    #: on an ordered queue (``QueueMeta.ordered_by``), the send time a message given back
    #: under its key keeps: its place among its key's messages (None: sent now, last)
    send_time: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class Message:
    """A received (leased) or listed message.

    ``key`` holds the key values in primary-key order, ``key_names`` the matching field names.
    ``payload`` is bytes for every payload type, the same on every engine (on an envelope
    queue the event's data, ``event`` its attributes, ``stored_payload`` the whole event):
    the stored bytes of a bytes queue, the UTF-8 text of a string queue, canonical JSON text
    (keys sorted, no spaces) of a json queue; ``text()`` and ``json()`` decode it.
    ``attempt`` counts deliveries, this one included (0 for a message never delivered), or
    is None where the engine cannot know it (a native queue's listed message, a failed read
    of the failure ledger). Native queues read it from the failure ledger when it is first
    read (``AttemptLoader``), so a receiver that never reads it costs no read.
    ``lease_token`` and ``lease_expires_at`` are set while the message is leased to a receiver.
    ``dropped`` is True on what a send with ``unique_for`` returns when it dropped the message
    (its key was sent within the window): nothing was written.
    """

    queue: str
    key: tuple[Any, ...]
    key_names: tuple[str, ...]
    payload: bytes = _PayloadField()  # type: ignore[assignment]
    deliver_time: datetime | None
    attempt: int | None = _AttemptField()  # type: ignore[assignment]
    lease_token: str | None = None
    lease_expires_at: datetime | None = None
    send_time: datetime | None = None
    dropped: bool = False

    def with_lease(self, lease_token: str | None, lease_expires_at: datetime | None) -> Message:
        """This message under a renewed lease; an attempt not read yet stays unread. Its
        fields are copied as they are (a payload already opened stays opened): ``replace()``
        cost seven times as much, and the relay freezes every message it hands over."""
        new = object.__new__(type(self))
        state = new.__dict__
        state.update(self.__dict__)
        state["lease_token"] = lease_token
        state["lease_expires_at"] = lease_expires_at
        return new

    def placed(self, send_time: datetime | None) -> Message:
        """This message with ``send_time`` (its place in its ordering key, which the engine
        keeps apart: ``spanner_queues.ordering``); an attempt not read yet stays unread."""
        return replace(
            self,
            payload=self.stored_payload,
            attempt=self.__dict__.get("_attempt", 0),
            send_time=send_time,
        )

    @property
    def stored_payload(self) -> bytes:
        """The bytes stored in the queue (on an envelope queue: the whole event)."""
        return self.__dict__.get("_payload", b"")

    @property
    def event(self) -> dict[str, Any] | None:
        """On an envelope queue, the CloudEvent's attributes (``id``, ``source``, ``type``,
        ``time``, ...; not its data, which is ``payload``); None on other queues."""
        opened = self.__dict__.get("_opened") or _open(self)
        return opened[1]

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


def leased_message(
    queue: str,
    key: tuple[Any, ...],
    key_names: tuple[str, ...],
    payload: bytes,
    deliver_time: datetime | None,
    attempt: int | None,
    lease_token: str | None,
    lease_expires_at: datetime | None,
    send_time: datetime | None,
) -> Message:
    """``Message(...)`` of a claimed row, a third of the cost: a frozen dataclass's
    ``__init__`` sets each field through ``object.__setattr__`` (the engines build every
    message of a claim)."""
    new = object.__new__(Message)
    new.__dict__.update(
        queue=queue,
        key=key,
        key_names=key_names,
        _payload=payload,
        deliver_time=deliver_time,
        _attempt=attempt,
        lease_token=lease_token,
        lease_expires_at=lease_expires_at,
        send_time=send_time,
        dropped=False,
    )
    return new


def may_have_failed(message: Message) -> bool:
    """Whether failed runs of ``message`` may be on record: its attempt is above 1, or
    unknown (None)."""
    attempt = message.attempt
    return attempt is None or attempt > 1

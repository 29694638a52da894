"""Publishing to Pub/Sub: ``Publish`` requests sent on the channel of Google's client, built
from protocol buffers, for a batch the caller already holds (a relay run, a replay batch).

Google's ``PublisherClient.publish`` batches one message at a time behind a timer, keeps a
sequencer and a future per message, and pauses an ordering key after a failed publish until
``resume_publish``: 40-125 us of CPU a message, where the request itself costs 3-5
(``benchmarks/pubsub_publish_paths.py``). Here a batch is sorted by topic and ordering key
(stably: each key's messages keep their order), cut into requests of at most
``MAX_REQUEST_MESSAGES`` messages and ``MAX_REQUEST_BYTES`` bytes, and every request goes out at
once, except that a request holding a key also held by the request before it (a key with more
messages than one request takes) goes only once that one is confirmed. A request is all or
nothing (Pub/Sub confirms every message of it or none), so a key's messages reach Pub/Sub in
their order and a failure leaves nothing paused: there is no state between batches.

The client still owns the channel: its credentials, endpoint, ``PUBSUB_EMULATOR_HOST``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
from google.api_core import exceptions as google_exceptions
from google.api_core.gapic_v1 import routing_header
from google.cloud.pubsub_v1.publisher import exceptions as publisher_exceptions
from google.pubsub_v1.types import pubsub

if TYPE_CHECKING:
    from google.cloud.pubsub_v1 import PublisherClient

#: Pub/Sub's limits on one ``Publish`` request (https://cloud.google.com/pubsub/quotas)
MAX_REQUEST_MESSAGES = 1000
MAX_REQUEST_BYTES = 10_000_000
#: an upper bound on what a message's fields add beyond their bytes (tags and lengths: a
#: field's tag and a length of up to 4 bytes each, for the message, its data, its ordering
#: key, and each attribute's entry, key and value)
_FIELD_OVERHEAD = 6

_MessagePb: Any = pubsub.PubsubMessage.pb()
_RequestPb: Any = pubsub.PublishRequest.pb()
_ResponsePb: Any = pubsub.PublishResponse.pb()


@dataclass(slots=True)
class Outgoing:
    """One message to publish: its topic's path, data, ordering key ("" for none) and
    attributes."""

    topic: str
    data: bytes
    ordering_key: str
    attributes: dict[str, str]


#: what ``Publisher.publish`` answers for a message it never sent (the message's own fault)
UNSENT = (publisher_exceptions.MessageTooLargeError, TypeError, ValueError)


class KeyFailed(google_exceptions.Aborted):
    """Not sent: a request before it holding the same ordering key was not confirmed (so the
    key's order holds: nothing after a failure is published)."""


class Publisher:
    """Publishes batches of ``Outgoing`` on ``client``'s channel (thread-safe: no state
    between batches)."""

    def __init__(self, client: PublisherClient) -> None:
        self._client = client
        self._call = client.transport.grpc_channel.unary_unary(
            "/google.pubsub.v1.Publisher/Publish",
            request_serializer=_RequestPb.SerializeToString,
            response_deserializer=_ResponsePb.FromString,
        )
        self._metadata: dict[str, tuple[tuple[str, str], ...]] = {}

    def close(self) -> None:
        """Close the client's channel (a publisher of a test's own; the process's lives on)."""
        self._client.transport.close()

    def publish(self, batch: Sequence[Outgoing], deadline: float) -> list[BaseException | None]:
        """Publish ``batch`` and wait for Pub/Sub's answers until ``deadline``
        (``time.monotonic()``). Returns, for each message in ``batch``'s order, ``None`` when
        Pub/Sub confirmed it, or why not: ``MessageTooLargeError``, ``TypeError`` or
        ``ValueError`` when it could not be sent at all (the message's fault, never sent);
        Pub/Sub's error for its request (``google.api_core.exceptions``: ``InvalidArgument``
        for a whole request refused, ``DeadlineExceeded`` past ``deadline``...); ``KeyFailed``
        when a request before it of the same key failed. Never raises for a message."""
        outcomes: list[BaseException | None] = [None] * len(batch)
        order = sorted(range(len(batch)), key=lambda i: (batch[i].topic, batch[i].ordering_key))
        lanes = self._lanes(batch, order, outcomes)
        calls = [self._send(lane[0], deadline) for lane in lanes]
        for lane, call in zip(lanes, calls, strict=True):
            for n, request in enumerate(lane):
                if n:
                    call = self._send(request, deadline)
                error = _wait(call, deadline)
                if error is not None:
                    for later in lane[n:]:
                        for i in later.indexes:
                            outcomes[i] = error if later is request else KeyFailed(str(error))
                    break
        return outcomes

    def _lanes(
        self, batch: Sequence[Outgoing], order: list[int], outcomes: list[BaseException | None]
    ) -> list[list[_Request]]:
        """Cut the messages (``order``: sorted by topic and key) into requests, and the requests
        into lanes: a request holding the key of the last message of the request before it
        follows that one in its lane; the others start lanes of their own."""
        lanes: list[list[_Request]] = []
        current: _Request | None = None
        for i in order:
            out = batch[i]
            try:
                pb = _MessagePb(data=out.data, ordering_key=out.ordering_key)
                pb.attributes.update(out.attributes)
            except (TypeError, ValueError) as exc:
                outcomes[i] = exc
                continue
            size = _size_bound(out)
            room = MAX_REQUEST_BYTES - len(out.topic) - 8  # (the request's topic field)
            if size > room and _too_large(out.topic, pb):
                outcomes[i] = publisher_exceptions.MessageTooLargeError(
                    f"the message would make a publish request over Pub/Sub's "
                    f"{MAX_REQUEST_BYTES} bytes"
                )
                continue
            if (
                current is None
                or current.topic != out.topic
                or len(current.messages) >= MAX_REQUEST_MESSAGES
                or current.size + size > room
            ):
                follows = (
                    current is not None
                    and current.topic == out.topic
                    and out.ordering_key != ""
                    and current.last_key == out.ordering_key
                )
                current = _Request(out.topic)
                if follows:
                    lanes[-1].append(current)
                else:
                    lanes.append([current])
            current.messages.append(pb)
            current.indexes.append(i)
            current.size += size
            current.last_key = out.ordering_key
        return lanes

    def _send(self, request: _Request, deadline: float) -> Any:
        """Send ``request`` without waiting (a gRPC future), or the error that kept it back."""
        left = deadline - time.monotonic()
        if left <= 0:
            return google_exceptions.DeadlineExceeded("no time left to publish")
        metadata = self._metadata.get(request.topic)
        if metadata is None:
            metadata = (routing_header.to_grpc_metadata((("topic", request.topic),)),)
            self._metadata[request.topic] = metadata
        pb = _RequestPb(topic=request.topic)
        pb.messages.extend(request.messages)
        try:
            return self._call.future(pb, timeout=left, metadata=metadata)
        except Exception as exc:  # the channel closed, a bad request
            return _google_error(exc)


@dataclass(slots=True, eq=False)
class _Request:
    """One ``Publish`` request being built: its topic, messages, their indexes in the batch,
    its size bound and its last message's ordering key."""

    topic: str
    messages: list[Any] = field(default_factory=list)
    indexes: list[int] = field(default_factory=list)
    size: int = 0
    last_key: str = ""


def _size_bound(out: Outgoing) -> int:
    """At least what ``out`` adds to a request's bytes (without encoding it)."""
    size = len(out.data) + len(out.ordering_key.encode()) + 3 * _FIELD_OVERHEAD
    for name, value in out.attributes.items():
        size += len(name.encode()) + len(value.encode()) + 3 * _FIELD_OVERHEAD
    return size


def _too_large(topic: str, pb: Any) -> bool:
    """Whether the message ``pb`` alone makes a request to ``topic`` over Pub/Sub's bytes
    (measured exactly: asked only when the bound is over)."""
    request = _RequestPb(topic=topic)
    request.messages.append(pb)
    return bool(request.ByteSize() > MAX_REQUEST_BYTES)


def _wait(call: Any, deadline: float) -> BaseException | None:
    """Wait for ``call`` (a gRPC future, or the error that kept it back) until ``deadline``;
    its error as ``google.api_core.exceptions`` has it, or ``None`` once confirmed."""
    if not isinstance(call, grpc.Future):  # (a gRPC future is an exception too: RpcError)
        return call
    try:
        call.result(timeout=max(deadline - time.monotonic(), 0.0) + 1.0)
    except Exception as exc:
        return _google_error(exc)
    return None


def _google_error(exc: Exception) -> BaseException:
    """``exc`` (a ``grpc.RpcError`` or a future's timeout) as ``google.api_core``'s error."""
    if isinstance(exc, grpc.RpcError) and isinstance(exc, grpc.Call):
        return google_exceptions.from_grpc_error(exc)
    if isinstance(exc, grpc.FutureTimeoutError):
        return google_exceptions.DeadlineExceeded("Pub/Sub did not answer in time")
    if isinstance(exc, grpc.FutureCancelledError):
        return google_exceptions.Cancelled("the publish was cancelled")
    return exc

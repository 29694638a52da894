"""``Publisher``: a batch in ``Publish`` requests of raw protocol buffers, against the Pub/Sub
emulator: each ordering key's messages in order, a key too long for one request in requests
sent one after the other, a failure that leaves the key's later requests unsent, a message too
large for any request refused unsent, nothing kept between batches."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from google.api_core import exceptions as google_exceptions
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.publisher import exceptions as publisher_exceptions

from spanner_queues.contrib.pubsub import publish
from spanner_queues.contrib.pubsub.publish import KeyFailed, Outgoing, Publisher
from tests.conftest import wait_until


@pytest.fixture
def publisher() -> Any:
    made = Publisher(pubsub_v1.PublisherClient())
    yield made
    made.close()


def _out(topic: str, key: str, n: int, data: bytes | None = None) -> Outgoing:
    body = data if data is not None else json.dumps({"key": key, "n": n}).encode()
    return Outgoing(topic, body, key, {"event_id": f"{key}-{n}"})


def _pulled_by_key(pubsub: Any, subscription: str, count: int) -> dict[str, list[int]]:
    subscriber = pubsub_v1.SubscriberClient()
    got: dict[str, list[int]] = {}
    try:

        def pulled() -> bool:
            answer = subscriber.pull(
                subscription=subscription, max_messages=100, timeout=5, retry=None
            )
            for r in answer.received_messages:
                body = json.loads(r.message.data)
                got.setdefault(r.message.ordering_key, []).append(body["n"])
            if answer.received_messages:
                subscriber.acknowledge(
                    subscription=subscription,
                    ack_ids=[r.ack_id for r in answer.received_messages],
                )
            return sum(map(len, got.values())) >= count

        assert wait_until(pulled, 30)
    finally:
        subscriber.close()
    return got


def _requests_sent(monkeypatch: Any, show: Any, failing: BaseException | None = None) -> list[Any]:
    """What ``show`` makes of each request ``Publisher`` sends, in order; with ``failing``, the
    first request is answered with it instead of being sent."""
    sent: list[Any] = []
    real = Publisher._send

    def recording(self: Publisher, request: Any, deadline: float) -> Any:
        sent.append(show(request))
        if failing is not None and len(sent) == 1:
            return failing
        return real(self, request, deadline)

    monkeypatch.setattr(Publisher, "_send", recording)
    return sent


def _keys(request: Any) -> list[str]:
    return [m.ordering_key for m in request.messages]


def test_each_keys_messages_reach_pubsub_in_order_across_requests(
    pubsub: Any, publisher: Publisher, monkeypatch: Any
) -> None:
    # three messages a request: key "a" (7 messages) takes three requests, which go one after
    # the other; "b" shares a request with "a" and keeps its own order
    monkeypatch.setattr(publish, "MAX_REQUEST_MESSAGES", 3)
    sent = _requests_sent(monkeypatch, _keys)
    batch = [_out(pubsub.topic, k, n) for n in range(7) for k in ("a", "b") if n < 4 or k == "a"]
    ordered = f"{pubsub.subscription}-ordered"
    assert publisher.publish(batch, time.monotonic() + 30) == [None] * len(batch)
    assert sent == [["a", "a", "a"], ["a", "a", "a"], ["a", "b", "b"], ["b", "b"]]
    assert _pulled_by_key(pubsub, ordered, 11) == {"a": list(range(7)), "b": list(range(4))}


def test_a_failed_request_leaves_its_keys_later_requests_unsent(
    pubsub: Any, publisher: Publisher, monkeypatch: Any
) -> None:
    monkeypatch.setattr(publish, "MAX_REQUEST_MESSAGES", 2)
    down = google_exceptions.ServiceUnavailable("Pub/Sub is down")
    sent = _requests_sent(monkeypatch, _keys, failing=down)
    batch = [_out(pubsub.topic, "a", n) for n in range(5)] + [_out(pubsub.topic, "", 9)]
    outcomes = publisher.publish(batch, time.monotonic() + 30)
    # the unordered message and "a"'s first share the failed request; "a"'s later ones
    # follow it and are never sent
    assert isinstance(outcomes[5], google_exceptions.ServiceUnavailable)
    assert isinstance(outcomes[0], google_exceptions.ServiceUnavailable)
    assert all(isinstance(o, KeyFailed) for o in outcomes[1:5])
    assert sent == [["", "a"]]


def test_a_message_too_large_for_any_request_is_refused_unsent_and_the_rest_published(
    pubsub: Any, publisher: Publisher, monkeypatch: Any
) -> None:
    monkeypatch.setattr(publish, "MAX_REQUEST_BYTES", 2000)
    batch = [_out(pubsub.topic, "", 1), _out(pubsub.topic, "", 2, b"x" * 2500)]
    batch.append(_out(pubsub.topic, "", 3))
    outcomes = publisher.publish(batch, time.monotonic() + 30)
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], publisher_exceptions.MessageTooLargeError)
    assert sorted(json.loads(m.data)["n"] for m in pubsub.pull()) == [1, 3]


def test_requests_are_cut_by_bytes_as_well_as_by_count(
    pubsub: Any, publisher: Publisher, monkeypatch: Any
) -> None:
    monkeypatch.setattr(publish, "MAX_REQUEST_BYTES", 3000)
    sizes = _requests_sent(monkeypatch, lambda request: sum(len(m.data) for m in request.messages))
    batch = [_out(pubsub.topic, "", n, b"%d" % n + b"x" * 999) for n in range(5)]
    assert publisher.publish(batch, time.monotonic() + 30) == [None] * 5
    assert sizes == [2000, 2000, 1000]  # two of about 1,050 bytes a request of 3,000


def test_a_missing_topic_is_pubsubs_error_for_each_message(
    pubsub: Any, publisher: Publisher
) -> None:
    gone = pubsub.topic + "-gone"
    outcomes = publisher.publish([_out(gone, "", 1), _out(gone, "k", 2)], time.monotonic() + 30)
    assert all(isinstance(o, google_exceptions.NotFound) for o in outcomes)


def test_a_batch_past_its_deadline_sends_nothing(pubsub: Any, publisher: Publisher) -> None:
    [outcome] = publisher.publish([_out(pubsub.topic, "", 1)], time.monotonic() - 1)
    assert isinstance(outcome, google_exceptions.DeadlineExceeded)
    assert pubsub.pull() == []

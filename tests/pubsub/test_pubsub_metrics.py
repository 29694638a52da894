"""The metrics app counts the relay's publishes, its lag and its publish errors, and the
inbox's dropped duplicates, through the signals the Pub/Sub app sends."""

from __future__ import annotations

from typing import Any

import pytest
from google.cloud import pubsub_v1
from prometheus_client import REGISTRY

from spanner_queues.contrib import metrics
from spanner_queues.contrib.pubsub.inbox import InboxPuller
from spanner_queues.worker import Worker
from tests.conftest import wait_until
from tests.pubsubapp.models import BillingInbox, OrderEvents

pytestmark = pytest.mark.django_db(transaction=True)


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_published_lag_errors_and_dropped_duplicates_are_counted(pubsub: Any) -> None:
    metrics.enable()
    queue = "pubsubapp.OrderEvents"
    published = value("spanner_queues_pubsub_published_total", queue=queue, topic=pubsub.topic)
    lags = value("spanner_queues_pubsub_relay_lag_seconds_count", queue=queue)
    refused = value("spanner_queues_pubsub_publish_errors_total", queue=queue, kind="refused")
    dropped = value(
        "spanner_queues_pubsub_inbox_duplicates_dropped_total", queue="pubsubapp.BillingInbox"
    )
    OrderEvents.send(order=1, message_id="a", payload={"pk": 1})
    OrderEvents.send(order=2, message_id="b" * 1100, payload={"pk": 2})  # refused
    Worker([queue], burst=True, install_signal_handlers=False).run()
    assert value("spanner_queues_pubsub_published_total", queue=queue, topic=pubsub.topic) == (
        published + 1
    )
    assert value("spanner_queues_pubsub_relay_lag_seconds_count", queue=queue) == lags + 1
    assert (
        value("spanner_queues_pubsub_publish_errors_total", queue=queue, kind="refused")
        == refused + 1
    )

    publisher = pubsub_v1.PublisherClient()
    for _ in range(2):
        publisher.publish(pubsub.topic, b'{"pk": 3}', event_id="same").result(30)
    inbox, subscriber = InboxPuller(BillingInbox), pubsub_v1.SubscriberClient()
    try:
        wait_until(lambda: inbox.pull_once(subscriber) >= 0 and inbox.taken_in == 2, 60)
        wait_until(lambda: inbox.pull_once(subscriber) >= 0 and inbox.duplicates == 1, 60)
    finally:
        subscriber.close()
    assert (
        value(
            "spanner_queues_pubsub_inbox_duplicates_dropped_total",
            queue="pubsubapp.BillingInbox",
        )
        == dropped + 1
    )

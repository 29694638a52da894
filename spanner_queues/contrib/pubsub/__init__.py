"""The outbox reaches other services through Google Cloud Pub/Sub: an optional app (label
``spanner_queues_pubsub``, the ``pubsub`` extra: google-cloud-pubsub).

    INSTALLED_APPS += ["spanner_queues.contrib.pubsub"]
    SPANNER_QUEUES_PUBSUB = {"PROJECT": "my-project"}   # default: GOOGLE_CLOUD_PROJECT

    class OrderEvents(Queue):                # relayed: runqueueworker publishes each message
        class QueueMeta:
            pubsub_topic = "orders"
            dead_letter_queue = "shop.OrderEventsDead"   # where Pub/Sub's refusals go

    class BillingInbox(Queue):               # an inbox: runqueueworker pulls the subscription
        event_id = models.CharField(max_length=128, primary_key=True)
        class QueueMeta:
            pubsub_subscription = "orders-billing"

``PUBSUB_EMULATOR_HOST`` works as it does for Google's client. The modules are private; the
public names are ``event_id`` (a relayed message's stable event id), ``PublishFailed`` and the
model ``SeenEvent``, imported lazily from here. Guarantees and limits: docs/howto/pubsub.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PublishFailed", "SeenEvent", "event_id"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        # on first use: Django imports this package before the app registry is ready, and
        # the model needs it ready (the relay needs the `pubsub` extra)
        from spanner_queues.contrib.pubsub import models, relay

        return getattr(models if name == "SeenEvent" else relay, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Test settings for the Pub/Sub app (tests/pubsub, collected only here and under
``tests.settings_pubsub_native``): ``tests.settings`` with ``spanner_queues.contrib.pubsub`` and
the two-service test app. The project comes from ``SQ_PUBSUB_PROJECT`` (each test uses one of
its own on the shared Pub/Sub emulator, which the tests start)."""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [
    *INSTALLED_APPS,
    "tests.pubsubapp",
    "spanner_queues.contrib.drill.pubsub",  # queuedrill --pubsub (tests/pubsub)
]
SPANNER_QUEUES_PUBSUB = {
    "PROJECT": os.environ.get("SQ_PUBSUB_PROJECT", "sq-test"),
    "PULL_WAIT_SECONDS": 1.0,
    # queuedrill --pubsub --ordered's outage: a relay run gives back what Pub/Sub has not
    # confirmed within this (tests/pubsub/test_queuedrill_pubsub.py)
    "PUBLISH_TIMEOUT_SECONDS": float(os.environ.get("SQ_PUBSUB_PUBLISH_TIMEOUT", "60")),
}

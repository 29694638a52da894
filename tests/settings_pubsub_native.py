"""``tests.settings_pubsub`` on native queues behind the queue-aware emulator front
(``tests.settings_spanner_native``)."""

from __future__ import annotations

import os

from tests.settings_spanner_native import *  # noqa: F403
from tests.settings_spanner_native import INSTALLED_APPS

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

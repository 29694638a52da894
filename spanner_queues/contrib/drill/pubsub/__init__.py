"""The fault drill's Pub/Sub mode (``manage.py queuedrill --pubsub``): an optional app with two
services' queues, for proving "every event's effect in the other service exactly once" through
the relay, Pub/Sub and the inbox (``spanner_queues.contrib.pubsub``).

Install beside the drill and the Pub/Sub apps: ``INSTALLED_APPS += ["spanner_queues.contrib.pubsub",
"spanner_queues.contrib.drill", "spanner_queues.contrib.drill.pubsub"]`` and ``manage.py migrate
spanner_queues_drill_pubsub``. Its modules are private. See docs/howto/fault-drill.md.
"""

from __future__ import annotations

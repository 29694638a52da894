"""The fault drill (``manage.py queuedrill``): an optional app with its own queue and effect
table, for proving "nothing lost, no effect twice" on your own database.

Install with ``INSTALLED_APPS += ["spanner_queues.contrib.drill"]`` and ``manage.py migrate
spanner_queues_drill``; it touches nothing but its two tables (``sq_drill_messages``, a queue,
and ``sq_drill_effects``). See docs/howto/fault-drill.md.
"""

from __future__ import annotations

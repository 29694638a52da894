"""The queue pages of the Django admin: overview, per-queue message browser, detail, actions.

Django's admin refuses composite primary keys, so these are the app's own views, mounted on the
admin site through ``QueuesAdmin`` (registered for the table-less ``Queues`` model in
``spanner_queues.admin``). Pages observe through the engine and the ORM; every action goes through
``spanner_queues.api`` or ``spanner_queues.deadletter`` in one transaction.
"""

from __future__ import annotations

"""The queue pages of the Django admin: overview, per-queue message browser, detail, actions.

Importing this package (Django's admin autodiscovery does) registers ``QueuesAdmin`` for the
table-less ``Queues`` model (``spanner_queues.models``) on the default admin site; mount it on
another site with ``site.register(Queues, QueuesAdmin)``. Django's admin refuses composite primary
keys, so these are the app's own views: pages observe through the engine and the ORM; every
action goes through ``spanner_queues.api`` or ``spanner_queues.deadletter`` in one transaction.

Modules (private): ``views`` (``QueuesAdmin``, the pages), ``browse`` (reading and filtering
messages), ``actions`` (what an operator can do), ``chart`` (the depth chart).
"""

from __future__ import annotations

from django.contrib import admin

from spanner_queues.admin.views import QueuesAdmin
from spanner_queues.models import Queues

__all__ = ["QueuesAdmin"]

admin.site.register(Queues, QueuesAdmin)

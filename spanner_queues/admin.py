"""Registers the queue pages on the default admin site (see ``spanner_queues.adminsite``)."""

from __future__ import annotations

from django.contrib import admin

from spanner_queues.adminsite.models import Queues
from spanner_queues.adminsite.views import QueuesAdmin

admin.site.register(Queues, QueuesAdmin)

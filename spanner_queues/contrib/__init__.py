"""Optional apps that ship with spanner_queues; none is installed unless listed in
``INSTALLED_APPS``."""

from __future__ import annotations

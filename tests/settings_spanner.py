"""Test settings for the Spanner emulator: the same suite, on django_spanner.

Importing this module starts a private emulator on a free loopback port (unless
``SPANNER_EMULATOR_HOST`` is already set, as it is in child processes) and stops it at exit.
"""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, emulator_databases

INSTANCE, DATABASES = emulator_databases(queues=False, test_prefix="sqtest")
INSTALLED_APPS = ["django_spanner", *INSTALLED_APPS]

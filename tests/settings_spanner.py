"""Test settings for the Spanner emulator: the same suite, on django_spanner.

Importing this module starts a private emulator on a free loopback port (unless
``SPANNER_EMULATOR_HOST`` is already set, as it is in child processes) and stops it at exit.
"""

from __future__ import annotations

import os

from spanner_queues.emulator import ensure_emulator
from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTANCE = os.environ.get("SQ_SPANNER_INSTANCE", "sq-test")
ensure_emulator(INSTANCE)

DATABASES = {
    "default": {
        "ENGINE": "django_spanner",
        "PROJECT": "test-project",
        "INSTANCE": INSTANCE,
        "NAME": os.environ.get("SQ_DATABASE_NAME", "sqdb"),
        "TEST": {"NAME": f"sqtest{os.getpid()}"},
    }
}
INSTALLED_APPS = ["django_spanner", *INSTALLED_APPS]

"""Test settings for the native engine end to end: the same suite as ``tests.settings_spanner``,
with ``ENGINE: native`` on the Cloud Spanner emulator behind the queue-aware front
(``python -m spanner_queues_emulator``, started on a free loopback port on import unless
``SPANNER_EMULATOR_HOST`` is already set, as it is in child processes).

Tests that need what the native engine does not do are skipped by its ``supports_*`` flags
(``pytest.mark.requires``), never by a list of names. ``tests/emulator`` (the front itself) and
``tests/native`` (the requests the native engine sends, and injected faults, through the front's
control API) are collected only here.
"""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS, emulator_databases

INSTANCE, DATABASES = emulator_databases(queues=True, test_prefix="sqn")
INSTALLED_APPS = ["django_spanner", *INSTALLED_APPS]

SPANNER_QUEUES = {
    "default": {
        "ENGINE": "native",
        "DATABASE": "default",
        "OPTIONS": {"RECEIVE_MAX_DURATION_SECONDS": 5.0, "RECEIVE_WAIT_SECONDS": 0.5},
    }
}

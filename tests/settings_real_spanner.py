"""Test settings for a real Cloud Spanner instance (``bin/test-real-spanner``): the conformance,
worker, process and drill suites with the native engine on real Spanner queues.

The instance comes from the environment: ``SPANNER_PROJECT``, ``SPANNER_INSTANCE`` (Enterprise
or Enterprise Plus edition: queues need it) and ``SPANNER_DATABASE`` (the database whose name
the test database is derived from; pytest creates ``sqr<pid>`` on the instance and drops it at
the end). Credentials: Application Default Credentials, e.g. ``GOOGLE_APPLICATION_CREDENTIALS``
naming a service account key. Importing this module without those variables raises
``ImproperlyConfigured`` naming them.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

REQUIRED = ("SPANNER_PROJECT", "SPANNER_INSTANCE", "SPANNER_DATABASE")
_missing = [name for name in REQUIRED if not os.environ.get(name)]
if _missing:
    raise ImproperlyConfigured(
        f"tests.settings_real_spanner needs {', '.join(_missing)} (and credentials: "
        "GOOGLE_APPLICATION_CREDENTIALS or Application Default Credentials)"
    )
if os.environ.get("SPANNER_EMULATOR_HOST"):
    raise ImproperlyConfigured(
        "SPANNER_EMULATOR_HOST is set: the client would talk to an emulator, not the real "
        "instance; unset it for tests.settings_real_spanner"
    )

PROJECT = os.environ["SPANNER_PROJECT"]
INSTANCE = os.environ["SPANNER_INSTANCE"]
os.environ["GOOGLE_CLOUD_PROJECT"] = PROJECT  # django_spanner reads the project here

INSTALLED_APPS = ["django_spanner", *INSTALLED_APPS]
DATABASES = {
    "default": {
        "ENGINE": "django_spanner",
        "PROJECT": PROJECT,
        "INSTANCE": INSTANCE,
        # child processes (worker tests, the drill's workers) get the test database's name
        "NAME": os.environ.get("SQ_DATABASE_NAME", os.environ["SPANNER_DATABASE"]),
        "TEST": {"NAME": f"sqr{os.getpid()}"[:30]},
    }
}

SPANNER_QUEUES = {
    "default": {
        "ENGINE": "native",
        "DATABASE": "default",
        "OPTIONS": {"RECEIVE_MAX_DURATION_SECONDS": 5.0, "RECEIVE_WAIT_SECONDS": 0.5},
    }
}

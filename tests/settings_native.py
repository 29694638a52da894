"""Settings for the native engine's tests (``pytest --ds=tests.settings_native tests/native``).

By default the Django database is django_spanner talking to an in-process fake of the Spanner
gRPC API (``tests.native.fake_spanner``), started on import. When
``SPANNER_QUEUES_REAL_DATABASE=projects/P/instances/I/databases/D`` is set, the tests run on
real Spanner instead: a test database is created on instance I (Enterprise or Enterprise Plus
edition) and dropped afterwards; credentials come from Application Default Credentials.
"""

from __future__ import annotations

import os
import re

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_spanner", "spanner_queues", "tests.testapp"]

REAL_DATABASE = os.environ.get("SPANNER_QUEUES_REAL_DATABASE", "")
FAKE_SPANNER = None

if REAL_DATABASE:
    _m = re.fullmatch(r"projects/([^/]+)/instances/([^/]+)/databases/([^/]+)", REAL_DATABASE)
    if not _m:
        raise ValueError(
            "SPANNER_QUEUES_REAL_DATABASE must look like projects/P/instances/I/databases/D"
        )
    _project, _instance, _database = _m.groups()
    os.environ["GOOGLE_CLOUD_PROJECT"] = _project  # django_spanner reads the project here
    DATABASES = {
        "default": {
            "ENGINE": "django_spanner",
            "PROJECT": _project,
            "INSTANCE": _instance,
            "NAME": _database,
            "TEST": {"NAME": f"sqn{os.getpid()}"[:30]},
        }
    }
    _duration = 5.0  # short streams (max_duration): restarts happen often
else:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import spanner

    from tests.native.fake_spanner import FakeSpanner

    os.environ.pop("SPANNER_EMULATOR_HOST", None)  # the fake is not the emulator
    FAKE_SPANNER = FakeSpanner().start()
    _client = spanner.Client(
        project=os.environ.setdefault("GOOGLE_CLOUD_PROJECT", "test-project"),
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": FAKE_SPANNER.endpoint},
        disable_builtin_metrics=True,
    )
    DATABASES = {
        "default": {
            "ENGINE": "django_spanner",
            "PROJECT": os.environ["GOOGLE_CLOUD_PROJECT"],
            "INSTANCE": "fake-instance",
            "NAME": "fakedb",
            "TEST": {"NAME": "fakedbtest"},
            "OPTIONS": {"client": _client},
        }
    }
    _duration = 5.0

SPANNER_QUEUES = {
    "default": {
        "ENGINE": "native",
        "DATABASE": "default",
        "OPTIONS": {
            "RECEIVE_MAX_DURATION_SECONDS": _duration,
            "RECEIVE_BATCH_SIZE": 10,
            "RECEIVE_WAIT_SECONDS": 1.0,
        },
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"spanner_queues": {"handlers": ["console"], "level": "ERROR"}},
}

"""Settings for ``tests/demo``: the demo project's own settings on a SQLite test file, with the
email kept in memory and a fast back-off. ``bin/test`` runs ``pytest --ds=tests.settings_demo
tests/demo``; under ``tests.settings`` the demo tests are not collected."""

from __future__ import annotations

import os

os.environ["DEMO_DATABASE"] = "sqlite"  # whatever the shell says: these tests use SQLite

from demo_project.settings import *  # noqa: F403
from demo_project.settings import BASE_DIR

VAR = BASE_DIR / "var"
_db_name = os.environ.get("SQ_DATABASE_NAME", str(VAR / "tests-demo.sqlite3"))
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _db_name,
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        },
        "TEST": {"NAME": str(VAR / f"test-demo-{os.getpid()}.sqlite3")},
    }
}
SPANNER_QUEUES = {
    "default": {
        "ENGINE": "table",
        "DATABASE": "default",
        "OPTIONS": {
            "LEASE_SECONDS": 10,
            "BACKOFF": {"INITIAL_SECONDS": 0.2, "MULTIPLIER": 2, "MAX_SECONDS": 5},
        },
    }
}
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
DEMO_REPORT_ROW_SECONDS = 0.02
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"spanner_queues": {"handlers": ["console"], "level": "WARNING"}},
}

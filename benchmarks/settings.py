"""Settings for ``benchmarks/core.py``: the test app's models on a fresh database.

``SQ_BENCH_DATABASE=sqlite`` (default): a SQLite file (WAL, ``transaction_mode="IMMEDIATE"``)
at ``SQ_BENCH_SQLITE_PATH``. ``SQ_BENCH_DATABASE=emulator``: a Spanner emulator (started by
``benchmarks/core.py`` before Django is set up) and the database ``SQ_BENCH_SPANNER_DATABASE``.
``SQ_BENCH_DATABASE=postgres``: the PostgreSQL server at ``SQ_PG_HOST``:``SQ_PG_PORT``
(``benchmarks/claim_scaling.py`` starts a private one).
"""

from __future__ import annotations

import os

SECRET_KEY = "benchmarks-only-not-secret"
DEBUG = False  # DEBUG=True would record every query
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "spanner_queues",
    "tests.testapp",
    "tests.tracingapp",  # benchmarks/tracing_cost.py: envelope queues
]

BACKEND = os.environ.get("SQ_BENCH_DATABASE", "sqlite")
if BACKEND == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ["SQ_BENCH_SQLITE_PATH"],
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
        }
    }
elif BACKEND == "emulator":
    DATABASES = {
        "default": {
            "ENGINE": "django_spanner",
            "PROJECT": "test-project",
            "INSTANCE": os.environ.get("SQ_BENCH_SPANNER_INSTANCE", "sq-bench"),
            "NAME": os.environ.get("SQ_BENCH_SPANNER_DATABASE", "sqbench"),
        }
    }
    INSTALLED_APPS = ["django_spanner", *INSTALLED_APPS]  # must be first
elif BACKEND == "postgres":  # a server started by the benchmark (tests.postgres_server)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ.get("SQ_PG_HOST", "127.0.0.1"),
            "PORT": os.environ["SQ_PG_PORT"],
            "USER": "postgres",
            "NAME": "postgres",
        }
    }
else:
    raise ValueError(f"SQ_BENCH_DATABASE must be sqlite, emulator or postgres, not {BACKEND!r}")

SPANNER_QUEUES = {
    "default": {
        "ENGINE": "spanner_queues.engines.table.TableQueueEngine",
        "DATABASE": "default",
        "OPTIONS": {"LEASE_SECONDS": 60},  # nothing expires during a measurement
    }
}

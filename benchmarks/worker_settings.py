"""Settings for ``benchmarks/worker_vs_django_tasks_db.py``: one SQLite file (WAL,
``transaction_mode="IMMEDIATE"``) shared by spanner_queues and django-tasks-db, with persistent
connections for both workers (``CONN_MAX_AGE = None``), at ``$SQ_BENCH_SQLITE_PATH``.
``$SQ_BENCH_SYNCHRONOUS`` sets ``PRAGMA synchronous`` for both (default ``FULL``, SQLite's
default: every commit waits for an fsync; ``NORMAL`` is safe from corruption in WAL mode).
``$SQ_BENCH_POSTGRES`` (``host:port/name``, set by ``sqlite_bench.setup`` with
``$SQ_BENCH_BACKEND=postgres``): that PostgreSQL database instead.
"""

from __future__ import annotations

import os

import django

SECRET_KEY = "benchmarks-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    *(["django_tasks"] if django.VERSION < (6,) else []),  # the backport, on Django 5.2
    "django_tasks_db",
    "spanner_queues",
    "spanner_queues.contrib.tasks",
    "benchmarks.workerbench",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SQ_BENCH_SQLITE_PATH", "/tmp/sq-worker-bench.sqlite3"),
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL;"
            + f"PRAGMA synchronous={os.environ.get('SQ_BENCH_SYNCHRONOUS', 'FULL')};",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        },
        "CONN_MAX_AGE": None,
    }
}

if os.environ.get("SQ_BENCH_POSTGRES"):  # host:port/name (``sqlite_bench.postgres_database``)
    _address, _name = os.environ["SQ_BENCH_POSTGRES"].split("/")
    _host, _port = _address.split(":")
    DATABASES["default"] = {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": _host,
        "PORT": int(_port),
        "USER": "postgres",
        "NAME": _name,
        "CONN_MAX_AGE": None,
    }

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

SPANNER_QUEUES = {
    "default": {
        "ENGINE": "spanner_queues.engines.table.TableQueueEngine",
        "DATABASE": "default",
        "OPTIONS": {"LEASE_SECONDS": 60},
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}

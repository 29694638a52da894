"""Test settings: a SQLite file (WAL, IMMEDIATE), the table engine, fast back-off."""

from __future__ import annotations

import os
from pathlib import Path

import django

BASE_DIR = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("SQ_VAR_DIR", BASE_DIR / "var"))
VAR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "spanner_queues",
    *(["django_tasks"] if django.VERSION < (6,) else []),  # the Tasks backport on Django 5.2
    "spanner_queues.contrib.tasks",  # Django's Tasks API (tests/tasks)
    "spanner_queues.contrib.metrics",  # Prometheus metrics (tests/metrics)
    "tests.testapp",
    "spanner_queues.testing.conformance",  # the engine conformance suite's queues
    "tests.workerapp",
    "tests.outboxapp",
    "tests.tracingapp",
    "tests.tasksapp",
    "spanner_queues.contrib.drill",  # the fault drill (tests/drill)
    # Pub/Sub (tests/pubsub, under tests.settings_pubsub with its two-service app): installed
    # here too, with no relayed or inbox queue it publishes and pulls nothing
    "spanner_queues.contrib.pubsub",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
# The admin tests create users: the default PBKDF2 hasher spends about a second of CPU on each.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Child processes (worker tests) are pointed at the parent's test database by SQ_DATABASE_NAME.
_db_name = os.environ.get("SQ_DATABASE_NAME", str(VAR / "tests.sqlite3"))
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _db_name,
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        },
        "TEST": {"NAME": str(VAR / f"test-{os.getpid()}.sqlite3")},
    }
}

SPANNER_QUEUES = {
    "default": {
        "ENGINE": "spanner_queues.engines.table.TableQueueEngine",
        "DATABASE": "default",
        "OPTIONS": {
            "LEASE_SECONDS": 10,
            "BACKOFF": {"INITIAL_SECONDS": 0.2, "MULTIPLIER": 2, "MAX_SECONDS": 5},
        },
    }
}

# Django's Tasks API on spanner_queues (tests/tasks): "default" and "emails" queue names
TASKS = {
    "default": {
        "BACKEND": "spanner_queues.contrib.tasks.QueueBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"QUEUE_MODELS": {"emails": "tasksapp.EmailTasks"}},
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"spanner_queues": {"handlers": ["console"], "level": "WARNING"}},
}
# Child processes of tests/process/test_console_logging.py: a project without LOGGING ("none"),
# or one whose root logger writes INFO to the console ("root").
if os.environ.get("SQ_TEST_LOGGING") == "none":
    del LOGGING
elif os.environ.get("SQ_TEST_LOGGING") == "root":
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"console": {"class": "logging.StreamHandler"}},
        "root": {"handlers": ["console"], "level": "INFO"},
    }


def emulator_databases(*, queues: bool, test_prefix: str) -> tuple[str, dict[str, dict]]:
    """(instance, DATABASES) on a private Spanner emulator (``queues``: behind the queue-aware
    front), started here unless ``SPANNER_EMULATOR_HOST`` is set (as in child processes)."""
    from spanner_queues.testing.emulator import ensure_emulator

    instance = os.environ.get("SQ_SPANNER_INSTANCE", "sq-test")
    ensure_emulator(instance, queues=queues)
    return instance, {
        "default": {
            "ENGINE": "django_spanner",
            "PROJECT": "test-project",
            "INSTANCE": instance,
            "NAME": os.environ.get("SQ_DATABASE_NAME", "sqdb"),
            "TEST": {"NAME": f"{test_prefix}{os.getpid()}"},
        }
    }


# tests/tracing: a runqueueworker child with the tracing app, exporting its spans to this file
if os.environ.get("SQ_TRACE_FILE"):
    INSTALLED_APPS = [*INSTALLED_APPS, "spanner_queues.contrib.tracing"]
    from tests.tracingapp.export import export_to_file

    export_to_file(os.environ["SQ_TRACE_FILE"])

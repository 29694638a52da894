"""Demo settings. SQLite by default; ``DEMO_DATABASE=emulator`` starts a private Spanner
emulator (table engine); ``DEMO_DATABASE=emulator-native`` starts the emulator behind the
queue-aware front (``python -m spanner_queues_emulator``) and runs every queue on the native
engine (``CREATE QUEUE``, ``RECEIVE``, ``RENEWLEASE``); ``DEMO_DATABASE=spanner`` with
``SPANNER_PROJECT``/``SPANNER_INSTANCE``/``SPANNER_DATABASE`` uses a real Spanner database
(credentials from the environment; ``SPANNER_QUEUES_ENGINE=native`` for real queues)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()


def _pubsub_at_hand() -> bool:
    """google-cloud-pubsub is installed, and Pub/Sub's emulator too or PUBSUB_EMULATOR_HOST set."""
    try:
        if importlib.util.find_spec("google.cloud.pubsub_v1") is None:
            return False
    except ModuleNotFoundError:  # no google.cloud at all
        return False
    if os.environ.get("PUBSUB_EMULATOR_HOST"):
        return True
    from spanner_queues.testing.pubsub import PubSubEmulatorNotFound, find_pubsub_emulator

    try:
        find_pubsub_emulator()
    except PubSubEmulatorNotFound:
        return False
    return True


VAR = Path(env.str("DEMO_VAR_DIR", default=str(BASE_DIR / "var")))
VAR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="demo-only-insecure-key")
DEBUG = env.bool("DJANGO_DEBUG", default=True)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "demo_project.urls"
WSGI_APPLICATION = "demo_project.wsgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # ops first: its runqueueworker (the app's, plus a heartbeat) replaces spanner_queues' one.
    "demo_project.ops",
    "spanner_queues",
    "spanner_queues.contrib.metrics",  # the worker image's --metrics-port (deploy/Dockerfile)
    "demo_project.accounts",
    "demo_project.search",
    "demo_project.images",
    "demo_project.shop",
    "demo_project.notifications",
    "demo_project.analytics",
    "demo_project.reports",
    "demo_project.traffic",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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

DEMO_DATABASE = env.str("DEMO_DATABASE", default="sqlite")
if DEMO_DATABASE == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env.str("DEMO_SQLITE_PATH", default=str(VAR / "demo-project.sqlite3")),
            # WAL and BEGIN IMMEDIATE: what concurrent receivers need (check spanner_queues.E003).
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
            },
        }
    }
elif DEMO_DATABASE in ("emulator", "emulator-native", "spanner"):
    if DEMO_DATABASE in ("emulator", "emulator-native"):
        from spanner_queues.testing.emulator import ensure_database, ensure_emulator

        # emulator-native: the emulator behind the queue-aware front, which has queues.
        ensure_emulator(
            env.str("SPANNER_INSTANCE", default="demo-instance"),
            queues=DEMO_DATABASE == "emulator-native",
        )
        ensure_database(
            env.str("SPANNER_INSTANCE", default="demo-instance"),
            env.str("SPANNER_DATABASE", default="demo-db"),
        )
    DATABASES = {
        "default": {
            "ENGINE": "django_spanner",
            "PROJECT": env.str("SPANNER_PROJECT", default="test-project"),
            "INSTANCE": env.str("SPANNER_INSTANCE", default="demo-instance"),
            "NAME": env.str("SPANNER_DATABASE", default="demo-db"),
        }
    }
    if env.str("SPANNER_DATABASE_ROLE", default=""):  # fine-grained access control
        DATABASES["default"]["OPTIONS"] = {"database_role": env.str("SPANNER_DATABASE_ROLE")}
    INSTALLED_APPS = ["django_spanner", *INSTALLED_APPS]  # must be first
else:
    raise environ.ImproperlyConfigured(
        f"DEMO_DATABASE must be sqlite, emulator, emulator-native or spanner, not {DEMO_DATABASE!r}"
    )

SPANNER_QUEUES = {
    "default": {
        "ENGINE": env.str(
            "SPANNER_QUEUES_ENGINE",
            default="native" if DEMO_DATABASE == "emulator-native" else "table",
        ),
        "DATABASE": "default",
        # Spanner's lease is 10 s; the worker renews leases halfway through.
        "OPTIONS": {"LEASE_SECONDS": env.float("DEMO_LEASE_SECONDS", default=10)},
    }
}
if SPANNER_QUEUES["default"]["ENGINE"] == "native":
    # A native receive waits up to RECEIVE_WAIT_SECONDS for its queue's stream; the demo's one
    # worker visits the queues it serves in turn (those with receivers: 11 of the 13, 9 of the
    # 10 without the shipping service), so it must not wait a second at each empty one.
    SPANNER_QUEUES["default"]["OPTIONS"]["RECEIVE_WAIT_SECONDS"] = env.float(
        "DEMO_RECEIVE_WAIT_SECONDS", default=0.05
    )

# Two services through Pub/Sub (demo_project.shipping): the shop relays each placed order's
# event to the topic "orders", the shipping service's inbox takes it in. On when Google's
# Pub/Sub emulator is installed (bin/demo starts it on a free loopback port and stops it) or
# PUBSUB_EMULATOR_HOST names one already running; DEMO_PUBSUB=0 turns it off.
DEMO_PUBSUB = env.bool("DEMO_PUBSUB", default=_pubsub_at_hand())
if DEMO_PUBSUB:
    INSTALLED_APPS += ["spanner_queues.contrib.pubsub", "demo_project.shipping"]
    SPANNER_QUEUES_PUBSUB = {
        "PROJECT": env.str("DEMO_PUBSUB_PROJECT", default="demo-project"),
        "PULL_WAIT_SECONDS": 1.0,
    }

#: simulated cost of one row of the sales export (reports app): 300 rows outlive a lease
DEMO_REPORT_ROW_SECONDS = env.float("DEMO_REPORT_ROW_SECONDS", default=0.05)

# Every email the demo sends is a file here: one file per connection, readable as text.
EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
EMAIL_FILE_PATH = VAR / "sent-emails"
DEFAULT_FROM_EMAIL = "shop@example.com"
ADMINS = [("Ops", "ops@example.com")]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"spanner_queues": {"handlers": ["console"], "level": "INFO"}},
}

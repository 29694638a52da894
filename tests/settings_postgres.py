"""Test settings for PostgreSQL: the same suite, on a real server (psycopg 3).

Importing this module starts a private PostgreSQL cluster on a free loopback port (unless
``SQ_PG_PORT`` is already set, as it is in child processes) and stops it at exit; see
``tests.postgres_server``.
"""

from __future__ import annotations

import os

from tests.postgres_server import SUPERUSER, ensure_postgres
from tests.settings import *  # noqa: F403

_host, _port = ensure_postgres()

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": _host,
        "PORT": _port,
        "USER": SUPERUSER,
        "NAME": os.environ.get("SQ_DATABASE_NAME", "sqdb"),
        "TEST": {"NAME": f"sqtest{os.getpid()}"},
    }
}

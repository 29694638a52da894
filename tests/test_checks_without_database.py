"""A plain ``manage.py check`` (as ``runserver`` runs it) runs the queue checks, E001-E013,
though ``check_queues`` is tagged ``database``: Django (5.2, 6.0) filters checks by tag only
when tags are given; a ``database``-tagged check runs too and is told the databases
(``databases``: None without ``--database``), which ``check_queues`` does not need: it reads
settings, models and migration files (the native engine's E007 asks the emulator named by
``SPANNER_EMULATOR_HOST``, not a database). These tests have no database: one opened would
fail them."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test.utils import override_settings


def test_plain_check_runs_the_queue_checks() -> None:
    call_command("check")
    with override_settings(USE_TZ=False), pytest.raises(SystemCheckError, match="E009"):
        call_command("check")
    bad = {"default": {"ENGINE": "table", "OPTIONS": {"LEASE_SECONDS": -1}}}
    with override_settings(SPANNER_QUEUES=bad), pytest.raises(SystemCheckError, match="E001"):
        call_command("check")


def test_plain_check_runs_the_sqlite_settings_checks() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's settings")
    original = connection.settings_dict["OPTIONS"]
    connection.settings_dict["OPTIONS"] = {}
    try:
        with pytest.raises(SystemCheckError, match="E003"):
            call_command("check")
    finally:
        connection.settings_dict["OPTIONS"] = original

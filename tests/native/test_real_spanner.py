"""The opt-in real-Spanner run. Set SPANNER_QUEUES_REAL_DATABASE and run
``pytest --ds=tests.settings_native tests/native``: test_conformance_native.py then runs on
real Spanner (docs/howto/spanner.md). Without it, this placeholder says how."""

from __future__ import annotations

import os

import pytest


@pytest.mark.skipif(
    not os.environ.get("SPANNER_QUEUES_REAL_DATABASE"),
    reason="real Spanner not configured: set SPANNER_QUEUES_REAL_DATABASE="
    "projects/P/instances/I/databases/D (Enterprise edition) to run the conformance suite "
    "on real Spanner queues",
)
@pytest.mark.django_db
def test_real_database_is_in_use() -> None:
    from django.conf import settings

    assert settings.FAKE_SPANNER is None

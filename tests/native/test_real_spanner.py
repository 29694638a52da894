"""The real-instance run (``bin/test-real-spanner``, docs/howto/fault-drill.md): under
``tests.settings_real_spanner`` the suites run on a real Cloud Spanner instance, and this test
checks that it is the one the environment names, not an emulator nor the emulator front.
Anywhere else it is skipped, saying which variables to set.
"""

from __future__ import annotations

import os

import pytest

REAL_SETTINGS = "tests.settings_real_spanner"
CONFIGURED = os.environ.get("DJANGO_SETTINGS_MODULE") == REAL_SETTINGS

pytestmark = pytest.mark.skipif(
    not CONFIGURED,
    reason="real Spanner not configured: set SPANNER_PROJECT, SPANNER_INSTANCE (Enterprise "
    "edition), SPANNER_DATABASE and credentials (GOOGLE_APPLICATION_CREDENTIALS or ADC), then "
    "run bin/test-real-spanner",
)


@pytest.mark.django_db
def test_the_real_instance_is_in_use() -> None:
    from django.db import connection

    from spanner_queues.engines import engines

    assert not os.environ.get("SPANNER_EMULATOR_HOST")
    assert engines["default"].features.supports_native_queues
    db = connection.settings_dict
    assert (db["PROJECT"], db["INSTANCE"]) == (
        os.environ["SPANNER_PROJECT"],
        os.environ["SPANNER_INSTANCE"],
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchall() == [(1,)]

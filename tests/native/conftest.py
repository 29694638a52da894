"""The native engine's tests at the wire: the exact SQL, parameters and mutations it sends,
and how it copes with injected faults, on the queue-aware emulator front
(``tests.settings_spanner_native``), whose control API (``spanner_queues_emulator.faults``) the
``front`` fixture is: it records every call of the test and fails the calls a test names.

Under ``tests.settings_real_spanner`` only ``test_real_spanner.py`` is collected (the check
that the real instance is in use).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

SETTINGS = os.environ.get("DJANGO_SETTINGS_MODULE")

if SETTINGS == "tests.settings_real_spanner":
    collect_ignore_glob = ["test_[!r]*.py", "test_review*.py"]
elif SETTINGS == "tests.settings_spanner_native":
    collect_ignore_glob = ["test_real_spanner.py"]
else:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def _control() -> Iterator[Any]:
    from spanner_queues_emulator.faults import FrontControl

    control = FrontControl(os.environ["SPANNER_EMULATOR_HOST"])
    yield control
    control.record(False)
    control.clear()
    control.close()


@pytest.fixture
def front(_control: Any) -> Any:
    """The front's control API; its record holds the calls made since this test started."""
    return _control


def database_ddl() -> list[str]:
    """The test database's schema as the front shows it (queues as declared)."""
    from django.db import connection

    connection.ensure_connection()
    database = connection.connection.database
    database.reload()
    return list(database.ddl_statements)


@pytest.fixture(autouse=True)
def _native_isolation(request: pytest.FixtureRequest) -> Iterator[None]:
    """On the front, each test starts with no fault and an empty record, and ends with no
    receive stream (``tests/conftest.py`` empties the queues after a transactional test)."""
    if SETTINGS != "tests.settings_spanner_native":  # the real instance: no control API
        yield
        return
    from spanner_queues.engines import engines

    _control = request.getfixturevalue("_control")
    _control.record(True)
    _control.clear()
    yield
    _control.end_streams()  # end RECEIVE streams so the receiver threads finish now
    engines["default"].stop_receiving(wait=5)
    _control.record(False)
    _control.clear()

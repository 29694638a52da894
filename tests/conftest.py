from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from django.db import connection

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 20.0, interval: float = 0.02) -> T:
    """Poll ``condition`` until it returns something truthy; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(interval)


@pytest.fixture
def wait() -> Callable[..., object]:
    return wait_until


@pytest.fixture
def child_env(transactional_db: None) -> dict[str, str]:
    """Environment for a child process that must use this test's database."""
    env = dict(os.environ)
    env["SQ_DATABASE_NAME"] = str(connection.settings_dict["NAME"])
    env["DJANGO_SETTINGS_MODULE"] = os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings")
    return env


def pytest_report_header(config: pytest.Config) -> str:
    from django.conf import settings

    db = settings.DATABASES["default"]
    where = os.environ.get("SPANNER_EMULATOR_HOST", "")
    return f"spanner_queues database: {db['ENGINE']} {where}".rstrip()

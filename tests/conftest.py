from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

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


def receive_due(queue: Any, count: int = 1, timeout: float = 60.0, **kwargs: Any) -> list[Any]:
    """Receive until ``count`` messages that are due have arrived (a streaming engine may hand
    them over a moment after they are due, or, if a stream of an earlier test leased them as it
    was being cancelled, after that 10 s lease); fail the test on timeout. Returns at once in
    the usual case."""
    from spanner_queues import api

    got: list[Any] = []

    def enough() -> bool:
        got.extend(api.receive(queue, **kwargs))
        return len(got) >= count

    wait_until(enough, timeout=timeout)
    return got


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

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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "requires(*flags): run only where the default queue engine has these EngineFeatures "
        "flags (e.g. 'supports_release'); skipped elsewhere, by the flags, never by name",
    )
    config.addinivalue_line(
        "markers", "unless(*flags): run only where the default queue engine lacks these flags"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    requires = [flag for mark in item.iter_markers("requires") for flag in mark.args]
    unless = [flag for mark in item.iter_markers("unless") for flag in mark.args]
    if not requires and not unless:
        return
    from spanner_queues.engines import engines

    engine = engines["default"]
    for flag in requires:
        if not getattr(engine.features, flag):
            pytest.skip(f"the {type(engine).__name__} engine has no {flag}")
    for flag in unless:
        if getattr(engine.features, flag):
            pytest.skip(f"for engines without {flag}")


@pytest.fixture(autouse=True)
def _native_queues_emptied(request: pytest.FixtureRequest) -> Any:
    """On native queues (not tables: Django's flush leaves them alone) each test ends with no
    RECEIVE stream running and every queue empty. Not for the wire tests (tests/native)."""
    yield
    if os.environ.get("DJANGO_SETTINGS_MODULE") != "tests.settings_spanner_native":
        return
    marker = request.node.get_closest_marker("django_db")
    transactional = marker is not None and (
        marker.kwargs.get("transaction") or (marker.args and marker.args[0])
    )
    if not transactional and not {"transactional_db", "live_server", "child_env"} & set(
        request.fixturenames
    ):
        return
    from spanner_queues.engines import engines
    from spanner_queues.registry import queue_models

    engine = engines["default"]
    engine.stop_receiving(wait=10)
    blocker = request.getfixturevalue("django_db_blocker")
    from django.db import transaction

    with blocker.unblock(), transaction.atomic():  # one commit for every queue
        for model in queue_models():
            engine.purge(model)

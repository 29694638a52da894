"""Helpers of the conformance suite (and of spanner_queues' own tests): waiting on a condition,
receiving what is due, emptying native queues between tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

__all__ = ["empty_native_queues", "receive_due", "wait_until"]


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


def uses_transactional_db(request: pytest.FixtureRequest) -> bool:
    """Whether the test commits (a transactional ``django_db`` mark or fixture)."""
    marker = request.node.get_closest_marker("django_db")
    if marker is not None and (
        marker.kwargs.get("transaction") or (marker.args and marker.args[0])
    ):
        return True
    return bool({"transactional_db", "live_server", "child_env"} & set(request.fixturenames))


def empty_native_queues(request: pytest.FixtureRequest, alias: str = "default") -> None:
    """End a test with no RECEIVE stream running and every queue empty. For an engine that keeps
    native queues (Django's flush after a transactional test empties tables, not queues); it
    needs the engine's ``purge(model)`` and ``declaration(model).name`` (the queue's name in
    SQL), as the native engine has."""
    from django.db import transaction

    from spanner_queues.engines import engines
    from spanner_queues.registry import queue_models

    engine = engines[alias]
    engine.stop_receiving(wait=10)
    blocker = request.getfixturevalue("django_db_blocker")
    with blocker.unblock():
        held = _queues_holding_messages(engine, list(queue_models()))  # one read
        with transaction.atomic(using=engine.database):  # one commit for every queue
            for model in held:
                engine.purge(model)


def _queues_holding_messages(engine: Any, models: list[Any]) -> list[Any]:
    """The queues among ``models`` that hold any message (leased or not), in one read."""
    from django.db import connections

    db = connections[engine.database]
    names = [db.ops.quote_name(engine.declaration(m).name) for m in models]
    sql = " UNION ALL ".join(f"SELECT {i}, COUNT(*) FROM {n}" for i, n in enumerate(names))
    with db.cursor() as cursor:
        cursor.execute(sql)
        return [models[i] for i, count in cursor.fetchall() if count]

"""Helpers of the conformance suite's tests (and of spanner_queues' own): waiting on a condition,
receiving what is due. (Emptying native queues between tests is the plugin's.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from spanner_queues import api

T = TypeVar("T")

__all__ = ["receive_due", "wait_until"]


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
    got: list[Any] = []

    def enough() -> bool:
        got.extend(api.receive(queue, **kwargs))
        return len(got) >= count

    wait_until(enough, timeout=timeout)
    return got

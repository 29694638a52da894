"""pytest fixtures of spanner_queues' test kit. Enable in a ``conftest.py``:

    pytest_plugins = ["spanner_queues.testing.pytest_plugin"]

Fixtures: ``queue_clock`` (a ``MovableClock`` for the test; skips the test where the default
engine's time cannot be moved), ``drain_queue`` (``drain``), ``sent_to`` (``assert_sent``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def queue_clock() -> Iterator[Any]:
    from spanner_queues.testing.kit import clock_is_movable, moved_clock

    if not clock_is_movable():
        pytest.skip("the default queue engine takes time from the database (native queues)")
    with moved_clock() as clock:
        yield clock


@pytest.fixture
def drain_queue() -> Callable[..., Any]:
    from spanner_queues.testing.kit import drain

    return drain


@pytest.fixture
def sent_to() -> Callable[..., Any]:
    from spanner_queues.testing.kit import assert_sent

    return assert_sent

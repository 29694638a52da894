"""pytest fixtures of spanner_queues' test kit. Enable in a ``conftest.py``:

    pytest_plugins = ["spanner_queues.testing.pytest_plugin"]

Fixtures: ``queue_clock`` (a ``MovableClock`` for the test; skips the test where the default
engine's time cannot be moved), ``drain_queue`` (``drain``), ``sent_to`` (``assert_sent``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest


def _kit() -> ModuleType:
    # pytest may load this plugin before django.setup() (``-p``, or a conftest.py that
    # configures settings itself); the kit imports models, so it is imported at first use
    from spanner_queues.testing import kit

    return kit


@pytest.fixture
def queue_clock() -> Iterator[Any]:
    kit = _kit()
    if not kit.clock_is_movable():
        pytest.skip("the default queue engine takes time from the database (native queues)")
    with kit.moved_clock() as clock:
        yield clock


@pytest.fixture
def drain_queue() -> Callable[..., Any]:
    return _kit().drain


@pytest.fixture
def sent_to() -> Callable[..., Any]:
    return _kit().assert_sent

"""spanner_queues' test kit for your own queues, receivers and tasks (see
``docs/howto/testing.md``): ``sent``/``assert_sent``, ``drain``, ``moved_clock``; pytest
fixtures in ``spanner_queues.testing.pytest_plugin``."""

from __future__ import annotations

from spanner_queues.testing.kit import (
    ClockNotMovable,
    Drained,
    MovableClock,
    Outcome,
    assert_sent,
    clock_is_movable,
    drain,
    moved_clock,
    sent,
)

__all__ = [
    "ClockNotMovable",
    "Drained",
    "MovableClock",
    "Outcome",
    "assert_sent",
    "clock_is_movable",
    "drain",
    "moved_clock",
    "sent",
]

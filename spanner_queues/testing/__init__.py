"""Tools for testing projects that use spanner_queues; never imported by the runtime.

- the test kit for your own queues, receivers and tasks (``docs/howto/testing.md``):
  ``sent``/``assert_sent``, ``drain``, ``moved_clock``; pytest fixtures in
  ``spanner_queues.testing.pytest_plugin``;
- ``spanner_queues.testing.emulator``: private Cloud Spanner emulator processes and the
  queue-aware front (``QueueEmulator``, ``ensure_emulator``, ``start_emulator``, ...).

Nothing under ``spanner_queues`` outside ``testing`` and ``emulator`` imports these modules
(``tests/test_import_graph.py`` holds that line).
"""

from __future__ import annotations

from typing import Any

#: the kit's names, imported on first use: settings modules import
#: ``spanner_queues.testing.emulator`` before Django's apps are loaded, and the kit needs them
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
_KIT = frozenset(__all__)


def __getattr__(name: str) -> Any:
    if name in _KIT:
        # on first use: the kit imports models, settings modules import this package
        from spanner_queues.testing import kit

        return getattr(kit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

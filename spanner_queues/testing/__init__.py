"""Tools for testing projects that use spanner_queues; never imported by the runtime.

- ``spanner_queues.testing.emulator``: private Cloud Spanner emulator processes and the
  queue-aware front (``QueueEmulator``, ``ensure_emulator``, ``start_emulator``, ...).

Nothing under ``spanner_queues`` outside ``testing`` and ``emulator`` imports these modules
(``tests/test_import_graph.py`` holds that line).
"""

from __future__ import annotations

"""Emulator processes for tests and development: a private ``emulator_main`` on a free port
(``ensure_emulator``, ``start_emulator``), its instance and database (``ensure_instance``,
``ensure_database``), and Google's emulator behind the queue-aware front (``QueueEmulator``,
``start_queue_emulator``).

The implementation is the distribution ``spanner-queues-emulator`` (package
``spanner_queues_emulator``, in ``emulator/`` of the repository; ``python -m
spanner_queues_emulator`` runs it); this is the app's testing-side name for it and the only
module of the app that imports it. Install it (``pip install ./emulator``) to use this module.
"""

from __future__ import annotations

try:
    from spanner_queues_emulator import (
        EmulatorNotFound,
        QueueEmulator,
        ensure_database,
        ensure_emulator,
        ensure_instance,
        find_emulator,
        free_port,
        start_emulator,
        start_queue_emulator,
    )
except ImportError as exc:  # the app's wheel does not carry the front
    raise ImportError(
        "spanner_queues.testing.emulator needs the emulator front, the distribution "
        "spanner-queues-emulator: pip install ./emulator (from a checkout of spanner-queues)"
    ) from exc

__all__ = [
    "EmulatorNotFound",
    "QueueEmulator",
    "ensure_database",
    "ensure_emulator",
    "ensure_instance",
    "find_emulator",
    "free_port",
    "start_emulator",
    "start_queue_emulator",
]

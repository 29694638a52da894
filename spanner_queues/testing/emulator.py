"""Emulator processes for tests and development: a private ``emulator_main`` on a free port
(``ensure_emulator``, ``start_emulator``), its instance and database (``ensure_instance``,
``ensure_database``), and Google's emulator behind the queue-aware front (``QueueEmulator``,
``start_queue_emulator``).

The implementation lives in ``spanner_queues.emulator`` (which ``python -m
spanner_queues.emulator`` runs); this is the testing-side name for it. Both are off the runtime
path: no module of the app imports either.
"""

from __future__ import annotations

from spanner_queues.emulator import (
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

"""The time spanner_queues reads: ``now()``.

Every read of the current time in the package's runtime code goes through ``now()`` (deliver
times, leases, back-off, the worker, the admin, the Tasks backend). It is Django's
``timezone.now()`` (an aware UTC datetime, with ``USE_TZ = True``, which check ``E009``
requires) unless a clock is installed: then it is that clock's time.

Installing a clock is for tests (``spanner_queues.testing.moved_clock`` does it):

- ``install(source)``: from now on, ``now()`` returns ``source()`` in every thread of the process,
  threads started earlier included. ``source`` must return aware UTC datetimes and be safe to
  call from any thread.
- ``uninstall(source)``: remove it; ``now()`` goes back to the clock installed before it, or to
  ``timezone.now()``. Installs nest: the latest one still installed is read.

``Throttle`` (the package's own, not exported): housekeeping a busy path asks for (a prune) at
most once per interval per key, on this process's monotonic clock (not ``now()``: an installed
clock does not move it).

Reading is lock-free (one reference read of the installed source); installing and uninstalling
take a lock. Engines that take time from the database (native Spanner queues: commit timestamps
decide deliver times and leases) do not follow an installed clock for what the database decides.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from datetime import datetime

from django.utils import timezone

__all__ = ["Source", "install", "installed", "now", "uninstall"]

Source = Callable[[], datetime]

_lock = threading.Lock()
_stack: list[Source] = []  # installed sources, latest last (guarded by _lock)
_current: Source | None = None  # _stack[-1] or None; read without the lock


def now() -> datetime:
    """The current time: the installed clock's, else ``django.utils.timezone.now()`` (looked up
    at each call, so a patch of Django's ``now`` applies)."""
    source = _current
    return timezone.now() if source is None else source()


def installed() -> Source | None:
    """The source ``now()`` reads, or None when no clock is installed (real time)."""
    return _current


def install(source: Source) -> None:
    """Make ``now()`` return ``source()``, process-wide, until ``uninstall(source)``."""
    global _current
    if not callable(source):
        raise TypeError(f"a clock is a callable returning a datetime, not {source!r}")
    with _lock:
        _stack.append(source)
        _current = source


def uninstall(source: Source) -> None:
    """Remove ``source`` (installed earlier with ``install``); ``now()`` reads the latest clock
    still installed, else real time. ``ValueError`` when ``source`` is not installed."""
    global _current
    with _lock:
        for i in range(len(_stack) - 1, -1, -1):
            if _stack[i] == source:
                del _stack[i]
                break
        else:
            raise ValueError(f"{source!r} is not an installed clock")
        _current = _stack[-1] if _stack else None


class Throttle:
    """Says yes to ``due(key, seconds)`` at most once per ``seconds`` for each key, in this
    process (thread-safe; one entry per key ever asked: callers key by database alias)."""

    def __init__(self) -> None:
        self._next: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def due(self, key: Hashable, seconds: float) -> bool:
        """True (and the next one ``seconds`` from now) if ``key``'s interval has passed."""
        now = time.monotonic()
        with self._lock:
            if now < self._next.get(key, 0.0):
                return False
            self._next[key] = now + seconds
            return True

"""One process-wide cache of ``engine.stats()`` per queue, so that what shows queue depth (the
worker's summary line, the metrics sampler and view) costs a bounded number of reads.

``engine.stats()`` is a scan of the queue (``COUNT(*)``, ``MIN(...)``: its cost grows with the
backlog). Through this cache a process reads each queue's stats at most once per ``max_age``
seconds, whoever asks (``STATS_MAX_AGE_SECONDS`` for the summary line; the metrics use their
``SAMPLE_INTERVAL_SECONDS``): with ``Q`` queues that is at most ``Q x 60 / max_age`` reads a
minute per process, whatever the number of threads, summary lines or scrapes.

``peek`` never blocks: it returns the latest stats known and, when they are older than
``max_age``, has one read made in the background (never two for one queue). The worker's
intake thread uses it, so a database that does not answer never holds up a receive.
``refresh`` reads queues again and waits for them at most ``wait`` seconds in all (the
worker's last summary line). ``get`` blocks for a read when the cached one is too old (bounded
by the engine's own deadline).

Background reads run side by side on at most ``STATS_READ_THREADS`` long-lived threads
(``transactions.ConnectionThread``), which keep their connections: a thread or a connection
per read would leave, on Spanner, a client's session-maintenance thread behind each time.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spanner_queues.engines import engine_for
from spanner_queues.transactions import ConnectionThread, forget_lost_connection

if TYPE_CHECKING:
    from spanner_queues.engines.base import QueueStats
    from spanner_queues.models import Queue

logger = logging.getLogger("spanner_queues.engines")

#: most background reads of stats at once in a process: each a thread and a connection, kept
STATS_READ_THREADS = 4

#: most age, in seconds, of the stats the worker's summary line shows (at least its interval)
STATS_MAX_AGE_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Reading:
    """The latest read of one queue's stats: its result or its error, and when (monotonic)."""

    stats: QueueStats | None
    error: BaseException | None
    at: float


class StatsCache:
    """The latest ``engine.stats()`` of each queue (by engine alias and label), in this
    process. Thread-safe; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readings: dict[tuple[str, str], Reading] = {}
        #: one lock per queue, held by whoever reads it (a second reader waits, then reuses)
        self._reading: dict[tuple[str, str], threading.Lock] = {}
        #: reads waiting or running in the background (``peek``, ``refresh``), each set once
        #: it is over
        self._background: dict[tuple[str, str], threading.Event] = {}
        #: the threads those reads run on, side by side, on connections they keep
        self._thread = ConnectionThread("spanner_queues-stats", size=STATS_READ_THREADS)
        #: reads made (``engine.stats()`` calls) in this process: tests pin the bound with it
        self.reads = 0

    @staticmethod
    def _key(model: type[Queue]) -> tuple[str, str]:
        return engine_for(model).alias, model._meta.label

    def latest(self, model: type[Queue]) -> Reading | None:
        with self._lock:
            return self._readings.get(self._key(model))

    def get(self, model: type[Queue], *, max_age: float | None = None) -> QueueStats:
        """``model``'s stats no older than ``max_age`` seconds (None or 0: read now), read
        here if need be; the read's error is raised."""
        key = self._key(model)
        with self._lock:
            lock = self._reading.setdefault(key, threading.Lock())
        with lock:
            reading = self._fresh(key, max_age)
            if reading is None:
                reading = self._read(model, key)
        if reading.error is not None:
            raise reading.error
        assert reading.stats is not None
        return reading.stats

    def peek(self, model: type[Queue], *, max_age: float) -> Reading | None:
        """The latest reading of ``model`` (None: never read), at once; when it is older than
        ``max_age`` seconds, one read is made on a stats thread (unless one is waiting or
        running)."""
        key = self._key(model)
        with self._lock:
            reading = self._readings.get(key)
            if reading is None or time.monotonic() - reading.at >= max_age:
                self._start(model, key)
        return reading

    def refresh(self, models: list[type[Queue]], *, wait: float) -> None:
        """Read each of ``models`` again on the stats threads, side by side (joining a read
        under way), and return once they are over or after ``wait`` seconds in all, whichever
        comes first; ``latest`` then has what they read."""
        with self._lock:
            done = [self._start(model, self._key(model)) for model in models]
        deadline = time.monotonic() + wait
        for event in done:
            if not event.wait(max(0.0, deadline - time.monotonic())):
                return

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until the background reads asked for so far are made; False on timeout."""
        return self._thread.wait_idle(timeout)

    def clear(self) -> None:
        """Forget every reading (tests)."""
        with self._lock:
            self._readings.clear()

    # --- internals ----------------------------------------------------------------------------
    def _fresh(self, key: tuple[str, str], max_age: float | None) -> Reading | None:
        if not max_age:
            return None
        with self._lock:
            reading = self._readings.get(key)
        if reading is not None and time.monotonic() - reading.at < max_age:
            return reading
        return None

    def _start(self, model: type[Queue], key: tuple[str, str]) -> threading.Event:
        """The read of ``key`` under way in the background, started now if none is (under
        ``_lock``); its event is set once it is over."""
        done = self._background.get(key)
        if done is None:
            done = self._background[key] = threading.Event()
            self._thread.submit(lambda: self._read_in_background(model, key, done))
        return done

    def _read(self, model: type[Queue], key: tuple[str, str]) -> Reading:
        with self._lock:
            self.reads += 1
        engine = engine_for(model)
        try:
            reading = Reading(engine.stats(model), None, time.monotonic())
        except Exception as exc:
            forget_lost_connection(exc, engine.database)  # the next read reconnects
            reading = Reading(None, exc, time.monotonic())
        with self._lock:
            self._readings[key] = reading
        return reading

    def _read_in_background(
        self, model: type[Queue], key: tuple[str, str], done: threading.Event
    ) -> None:
        try:
            with self._lock:
                lock = self._reading.setdefault(key, threading.Lock())
            with lock:
                reading = self._read(model, key)
            if reading.error is not None:
                logger.debug("stats of %s failed: %r", key[1], reading.error)
        finally:
            with self._lock:
                self._background.pop(key, None)
            done.set()


#: the process's cache
stats_cache = StatsCache()

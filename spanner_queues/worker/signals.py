"""Signals: the first SIGTERM/SIGINT stops the worker gracefully (finish and ack in-flight
messages), a second one ends the process at once with exit status 1."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

logger = logging.getLogger("spanner_queues.worker")


@contextlib.contextmanager
def on_stop(callback: Callable[[int], None]) -> Iterator[None]:
    """Call ``callback(signum)`` on SIGINT/SIGTERM inside the block; restore the previous
    handlers afterwards (procrastinate's ``on_stop``)."""
    signums = [signal.SIGINT, signal.SIGTERM]
    previous = {s: signal.getsignal(s) for s in signums}
    for s in signums:
        signal.signal(s, lambda signum, frame: callback(signum))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def abort_process() -> None:
    """End the process now, exit status 1 (unacked messages come back after their lease)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


class StopOnSignal:
    """The signal handler of one worker: ``stop`` first, ``abort`` the second time."""

    def __init__(
        self,
        stop: Callable[[], None],
        stopping: Callable[[], bool],
        emit: Callable[..., None],
        abort: Callable[[], None] = abort_process,
    ) -> None:
        self._stop = stop
        self._stopping = stopping
        self._emit = emit
        self._abort = abort
        #: a first signal came (its stop may still be on its way)
        self._signalled = False

    def _begin_stop(self) -> None:
        self._emit("stopping")
        self._stop()

    def __call__(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if not (self._signalled or self._stopping()):
            self._signalled = True
            logger.warning(
                "%s received: finishing in-flight messages, then exiting (send it again to "
                "exit at once).",
                name,
                extra={"action": "stopping"},
            )
            # The stop runs on a thread of its own, not in the handler: the handler runs on
            # the main thread between two of its bytecodes, maybe inside a listener that
            # holds a plain lock (the health probes'), and the "stopping" event would wait
            # for that lock on the thread that holds it, for ever.
            threading.Thread(target=self._begin_stop, name="sq-stop", daemon=True).start()
        else:
            logger.warning(
                "%s received again: exiting now; unacked messages are redelivered after "
                "their lease.",
                name,
                extra={"action": "abort"},
            )
            self._abort()

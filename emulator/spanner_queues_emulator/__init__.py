"""Spanner queues on a laptop: Google's Cloud Spanner emulator behind a queue-aware front.

    pip install ./emulator        # or: pip install spanner-queues-emulator
    spanner-queues-emulator --host-port 127.0.0.1:9010   # = python -m spanner_queues_emulator
    export SPANNER_EMULATOR_HOST=127.0.0.1:9010

or, in Python (tests)::

    with QueueEmulator() as emulator:
        os.environ["SPANNER_EMULATOR_HOST"] = emulator.host

The front serves the whole Spanner gRPC API on one port; queue DDL, ``RECEIVE_<Q>``,
``RENEWLEASE_<Q>`` and the ``Send``/``Ack`` mutations are its own, everything else is the
emulator's (``spanner_queues_emulator.front``). A distribution of its own
(``spanner-queues-emulator``): it imports no Django and nothing of the ``spanner_queues`` app.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from types import TracebackType
from typing import Any

from spanner_queues_emulator.process import (
    EmulatorNotFound,
    ensure_database,
    ensure_emulator,
    ensure_instance,
    find_emulator,
    free_port,
    start_emulator,
    start_queue_emulator,
    terminate,
)

__version__ = "0.1.0"

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


logger = logging.getLogger("spanner_queues_emulator")


class QueueEmulator:
    """A private ``emulator_main`` and the queue-aware front before it, in this process.

    ``host`` is the front's ``host:port`` (use it as ``SPANNER_EMULATOR_HOST``). ``stop()``
    ends open RECEIVE streams, the front and the emulator; nothing is left running.

    Should ``emulator_main`` exit by itself, the front logs it (logger
    ``spanner_queues_emulator``, ERROR), answers every call ``UNAVAILABLE`` naming the cause,
    and sets ``failed`` (``failure`` says why); ``python -m spanner_queues_emulator`` then
    exits non-zero. ``start()`` raises ``AddressInUse`` when the port is taken.
    """

    def __init__(
        self,
        host_port: str = "127.0.0.1:0",
        *,
        short_receive: str | None = None,
        backoff: str | None = None,
        retry_info: str | None = None,
        deliver_time: str | None = None,
    ) -> None:
        from spanner_queues_emulator.answers import backoff_mode, retry_info_mode
        from spanner_queues_emulator.queues import deliver_time_mode
        from spanner_queues_emulator.receiving import short_receive_mode

        self.host_port = host_port
        #: how very short RECEIVE calls are answered (``receiving``): ``short_receive``, else
        #: ``SPANNER_QUEUES_EMULATOR_SHORT_RECEIVE``, else ``generous``
        self.short_receive = short_receive_mode(short_receive)
        #: the other open answers (``answers``): the argument, else its environment variable
        self.backoff = backoff_mode(backoff)
        self.retry_info = retry_info_mode(retry_info)
        #: what a lease does to ``DeliverTime`` (``queues``): ``deliver_time``, else
        #: ``SPANNER_QUEUES_EMULATOR_DELIVER_TIME``, else ``kept``
        self.deliver_time = deliver_time_mode(deliver_time)
        self.host = ""
        self.failed = threading.Event()
        self.failure: str | None = None
        self._server: Any = None
        self._front: Any = None
        self._emulator: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> QueueEmulator:
        from spanner_queues_emulator.front import serve

        backend, self._emulator = start_emulator()
        try:
            self._server, self._front = serve(
                backend,
                self.host_port,
                short_receive=self.short_receive,
                backoff=self.backoff,
                retry_info=self.retry_info,
                deliver_time=self.deliver_time,
            )
        except BaseException:
            self._stop_emulator()
            raise
        host = self.host_port.rsplit(":", 1)[0]
        self.host = f"{host}:{self._server.bound_port}"
        self._watcher = threading.Thread(
            target=self._watch, args=(self._emulator,), name="sq-emulator-watch", daemon=True
        )
        self._watcher.start()
        return self

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        if self._stopping.is_set():
            return
        self.failure = (
            f"emulator_main exited with code {code} (pid {proc.pid}); the emulator front at "
            f"{self.host} has no database behind it: restart it"
        )
        logger.error("%s", self.failure)
        front = self._front
        if front is not None:
            front.backend_lost(self.failure)
        self.failed.set()

    def stop(self, grace: float = 1.0) -> None:
        self._stopping.set()
        if self._front is not None:
            self._front.shutdown()
        if self._server is not None:
            self._server.stop(grace).wait(grace + 5)
            self._server = None
        if self._front is not None:
            self._front.channel.close()
            self._front = None
        self._stop_emulator()

    def _stop_emulator(self) -> None:
        self._stopping.set()
        proc, self._emulator = self._emulator, None
        if proc is not None:
            terminate(proc)
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.join(5)

    def __enter__(self) -> QueueEmulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

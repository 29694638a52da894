"""Worker heartbeats: ``beat()`` replaces the worker's message; ``Heartbeat`` keeps beating
from a thread and deletes the message on a clean stop."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from datetime import timedelta
from types import TracebackType
from typing import Any

from django.db import connections

from demo_project.ops.models import WorkerHeartbeats
from spanner_queues.message import Message
from spanner_queues.patterns import beat, cancel

logger = logging.getLogger(__name__)

BEAT_EVERY = timedelta(seconds=10)
TIMEOUT = timedelta(seconds=60)


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def send_beat(worker_id: str, *, timeout: timedelta = TIMEOUT, **info: Any) -> Message:
    """Delete the worker's heartbeat and send a new one due ``timeout`` from now, in one
    transaction (queues have no UPDATE)."""
    return beat(WorkerHeartbeats, {"worker_id": worker_id}, timeout=timeout, payload=info)


def end_beats(worker_id: str) -> int:
    """A clean shutdown: delete the heartbeat, so no alert fires."""
    return cancel(WorkerHeartbeats, {"worker_id": worker_id})


class Heartbeat:
    """``with Heartbeat(worker_id): run_the_worker()``."""

    def __init__(
        self, worker_id: str, *, every: timedelta = BEAT_EVERY, timeout: timedelta = TIMEOUT
    ) -> None:
        self.worker_id = worker_id
        self.every = every
        self.timeout = timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def _beat(self) -> None:
        try:
            send_beat(
                self.worker_id, timeout=self.timeout, host=socket.gethostname(), pid=os.getpid()
            )
        except Exception:  # a missed beat is not fatal; the next one may succeed
            logger.exception("heartbeat of %s failed", self.worker_id)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.every.total_seconds()):
                self._beat()
        finally:
            connections.close_all()

    def __enter__(self) -> Heartbeat:
        self._beat()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        end_beats(self.worker_id)

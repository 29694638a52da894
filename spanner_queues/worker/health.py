"""Health of one worker process for container probes: ``/livez`` and ``/readyz`` over HTTP.

``WorkerHealth`` is a ``Worker`` listener that also reads what the worker holds (its
``slots`` and ``plans``, once attached):

- **live** (``/livez`` 200) unless a loop stopped turning or a receiver is past its limit:
  the receive loop reported nothing (a receive, an idle poll, a summary) for ``stall_seconds``
  while no receiver runs; a held lease was due for renewal ``stall_seconds`` ago and the
  renewer did not renew it; or a receiver has run longer than its limit (the receiver's
  ``timeout``, else the worker's, else ``max_run_seconds``; no limit when none is set).
  Starting and stopping are live: a worker that drains is not to be restarted.
- **ready** (``/readyz`` 200) only while the worker has started, is not stopping, its loops
  are live and every database its queues use answers ``SELECT 1`` within
  ``db_check_timeout`` seconds (checked at most every ``db_check_seconds``, never two checks
  at once, on the process's one readiness thread, whose connections are kept: a connection
  opened and closed per probe leaves, on Spanner, a client's session-maintenance thread
  behind each time). While a database does not answer (an outage: the check waits on the
  client's bounded retries) the worker is not ready.

Answers are ``text/plain``: ``ok`` or the reasons, one a line. ``serve`` runs the HTTP server
(a daemon thread; one thread per connection, at most ``MAX_CONNECTIONS``, each closed after
``READ_TIMEOUT_SECONDS`` without a request) and can hand ``/metrics`` to another WSGI app (the
Prometheus exposition: one port for metrics and probes); every other path is 404.
"""

from __future__ import annotations

import logging
import socketserver
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.db import connections

from spanner_queues import clock
from spanner_queues.transactions import ConnectionThread, forget_lost_connection
from spanner_queues.worker.events import FINAL_EVENTS, WorkerEvent

if TYPE_CHECKING:
    from spanner_queues.message import Message
    from spanner_queues.worker import Worker
    from spanner_queues.worker.slots import Plan, Slots

logger = logging.getLogger("spanner_queues.worker")

__all__ = ["DEFAULT_STALL_SECONDS", "WorkerHealth", "serve"]

#: seconds without a turn of a loop (while nothing runs) after which the worker is not live
DEFAULT_STALL_SECONDS = 60.0
#: events the receive loop emits as it turns
_LOOP_EVENTS = frozenset({"worker_started", "received", "idle", "summary"})

#: seconds a readiness probe waits for the databases to answer before it says "not ready"
DEFAULT_DB_CHECK_TIMEOUT = 5.0
#: the thread the database checks of every ``WorkerHealth`` of the process run on
_db_checks = ConnectionThread("spanner_queues-readiness")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class WorkerHealth:
    """Liveness and readiness of one worker (see the module docstring). Thread-safe."""

    def __init__(
        self,
        *,
        stall_seconds: float = DEFAULT_STALL_SECONDS,
        max_run_seconds: float | None = None,
        db_check_seconds: float = 2.0,
        db_check_timeout: float = DEFAULT_DB_CHECK_TIMEOUT,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stall_seconds = stall_seconds
        self.max_run_seconds = max_run_seconds
        self.db_check_seconds = db_check_seconds
        self.db_check_timeout = db_check_timeout
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._slots: Slots | None = None
        self._plans: list[Plan] = []
        self._started = False
        self._stopping = False
        self._loop_at = monotonic()
        #: (queue, key) -> (receiver name, monotonic start) of each running message
        self._running: dict[tuple[str, tuple[Any, ...]], tuple[str, float, Message]] = {}
        self._db_lock = threading.Lock()
        self._db_checked_at: float | None = None
        self._db_problems: list[str] = []
        #: the check on its way (one at a time, whatever the probes' rate)
        self._db_check: Future[list[str]] | None = None

    def attach(self, worker: Worker) -> None:
        """The worker whose slots (held leases, stuck receivers, stopping) and plans (queues'
        databases, time limits) are read."""
        self._slots, self._plans = worker.slots, list(worker.plans)

    # --- the listener ---------------------------------------------------------------------
    def __call__(self, event: WorkerEvent) -> None:
        now = self._monotonic()
        name = event.name
        with self._lock:
            if name in _LOOP_EVENTS:
                self._loop_at = now
                if name == "worker_started":
                    self._started = True
            elif name == "started" and event.message is not None:
                m = event.message
                self._running[(m.queue, m.key)] = (event.receiver or "?", now, m)
            elif name in FINAL_EVENTS and event.message is not None:
                self._running.pop((event.message.queue, event.message.key), None)
            elif name in ("stopping", "stopped"):
                self._stopping = True

    # --- the checks -----------------------------------------------------------------------
    def _limit(self, receiver: str, message: Message) -> float | None:
        """A receiver's time limit on ``message`` (``Plan.time_limit``: its ``timeout_of``, its
        own ``timeout``, the worker's), or ``max_run_seconds``."""
        for plan in self._plans:
            for spec in plan.specs:
                if spec.name == receiver:
                    limit = plan.time_limit(spec, [message])
                    if limit is not None:
                        return limit
        return self.max_run_seconds

    def liveness(self) -> list[str]:
        """Why the worker is not live; empty when it is."""
        now = self._monotonic()
        problems = []
        with self._lock:
            running = list(self._running.items())
            loop_idle = now - self._loop_at
        for (queue, key), (receiver, since, message) in running:
            limit = self._limit(receiver, message)
            if limit is not None and now - since > limit:
                problems.append(
                    f"receiver {receiver} has run {now - since:.1f} s on {queue}{key}, "
                    f"past its limit of {limit:g} s"
                )
        if not running and loop_idle > self.stall_seconds:
            problems.append(
                f"the receive loop has not turned for {loop_idle:.1f} s "
                f"(limit {self.stall_seconds:g} s)"
            )
        slots = self._slots
        if slots is not None:
            if slots.stuck_units:
                problems.append(
                    f"{slots.stuck_units} receiver(s) could not be interrupted past their "
                    "time limit: the worker is stopping to be restarted"
                )
            wall = clock.now()
            overdue = [
                (wall - d.renew_at).total_seconds()
                for d in slots.renewable()
                if d.renew_at is not None
                and (wall - d.renew_at).total_seconds() > self.stall_seconds
            ]
            if overdue:
                problems.append(
                    f"the lease renewer is {max(overdue):.1f} s late on {len(overdue)} lease(s)"
                )
        return problems

    def readiness(self) -> list[str]:
        """Why the worker should receive no traffic; empty when it is ready."""
        slots = self._slots
        with self._lock:
            started, stopping = self._started, self._stopping
        if slots is not None and slots.stopping:
            stopping = True
        if stopping:
            return ["stopping: receiving has ended, in-flight messages are finishing"]
        if slots is None or not started:
            return ["starting: the worker is not receiving yet"]
        return self.liveness() + self._databases()

    def _databases(self) -> list[str]:
        with self._db_lock:
            now = self._monotonic()
            if self._db_checked_at is not None and now - self._db_checked_at < (
                self.db_check_seconds
            ):
                return list(self._db_problems)
            if self._db_check is None:
                aliases = sorted({plan.db for plan in self._plans})
                self._db_check = _db_checks.submit(lambda: _check_databases(aliases))
            check = self._db_check
        try:
            problems = check.result(timeout=self.db_check_timeout)
        except FutureTimeout:
            return [f"the databases did not answer within {self.db_check_timeout:g} s"]
        with self._db_lock:
            if self._db_check is check:
                self._db_check = None
                self._db_problems, self._db_checked_at = problems, self._monotonic()
        return list(problems)

    # --- WSGI -------------------------------------------------------------------------------
    def wsgi(self, fallback: WSGIApp | None = None) -> WSGIApp:
        """A WSGI app: ``/livez``, ``/readyz``, and ``/metrics`` from ``fallback`` when given;
        every other path is 404 (a probe on a mistyped path never reads as healthy)."""

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path in ("/livez", "/readyz"):
                try:
                    problems = self.liveness() if path == "/livez" else self.readiness()
                except Exception as exc:  # a probe that cannot tell says "not healthy"
                    logger.exception("health check %s failed", path)
                    problems = [f"the check failed: {type(exc).__name__}: {exc}"]
                status = "503 Service Unavailable" if problems else "200 OK"
                body = ("\n".join(problems) if problems else "ok").encode() + b"\n"
                start_response(
                    status,
                    [
                        ("Content-Type", "text/plain; charset=utf-8"),
                        ("Content-Length", str(len(body))),
                    ],
                )
                return [body]
            if fallback is not None and path == "/metrics":
                return fallback(environ, start_response)
            body = b"not found: /livez, /readyz" + (b", /metrics" if fallback else b"") + b"\n"
            start_response(
                "404 Not Found",
                [
                    ("Content-Type", "text/plain; charset=utf-8"),
                    ("Content-Length", str(len(body))),
                ],
            )
            return [body]

        return app


def _check_databases(aliases: list[str]) -> list[str]:
    """Why each of ``aliases`` is not ready: ``SELECT 1`` on this thread's connection, which is
    kept (a lost one is closed: the next check reconnects)."""
    problems = []
    for alias in aliases:
        try:
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT 1")
                cursor.fetchall()
        except Exception as exc:  # any failure means: not ready
            forget_lost_connection(exc, alias)
            problems.append(f"database {alias!r} does not answer: {exc}")
    return problems


#: seconds a connection may take to send its request (an idle one is closed after)
READ_TIMEOUT_SECONDS = 10.0
#: connections served at once (one thread each); a connection beyond them is closed at once
MAX_CONNECTIONS = 16


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog: connections wait there, not in threads
    slots: threading.BoundedSemaphore

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):  # at the cap: no thread, no wait
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _QuietHandler(WSGIRequestHandler):
    timeout = READ_TIMEOUT_SECONDS  # the socket's timeout: an idle connection ends after it

    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds
        pass


def serve(
    port: int,
    addr: str,
    health: WorkerHealth,
    fallback: WSGIApp | None = None,
    *,
    read_timeout: float = READ_TIMEOUT_SECONDS,
    max_connections: int = MAX_CONNECTIONS,
) -> tuple[WSGIServer, int]:
    """Serve ``health``'s probes (and ``fallback`` on ``/metrics``) at ``addr:port`` from a
    daemon thread; port 0 picks a free one. At most ``max_connections`` are served at once
    (one thread each; a connection beyond them is closed unanswered), and a connection that
    sends no complete request within ``read_timeout`` seconds is closed. Returns the server
    and its port; ``OSError`` when the port is taken."""
    handler = type("_Handler", (_QuietHandler,), {"timeout": read_timeout})
    server = make_server(
        addr, port, health.wsgi(fallback), server_class=_Server, handler_class=handler
    )
    assert isinstance(server, _Server)
    server.slots = threading.BoundedSemaphore(max_connections)
    thread = threading.Thread(target=server.serve_forever, name="sq-health", daemon=True)
    thread.start()
    return server, server.server_port

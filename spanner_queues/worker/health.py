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
  client's bounded retries) the worker is not ready; nor while a check added with
  ``add_readiness_check`` reports a problem (an inbox that cannot pull).

Answers are ``text/plain``: ``ok`` or the reasons, one a line. ``serve`` runs the HTTP server,
``ProbeServer`` (one daemon thread and a selector over every connection, so slow or idle
connections cost a socket, not a thread: each has ``READ_TIMEOUT_SECONDS`` from its accept to
send its whole request, and past ``MAX_CONNECTIONS`` a new one closes the oldest), and can hand
``/metrics`` to another WSGI app (the Prometheus exposition: one port for metrics and probes);
every other path is 404.
"""

from __future__ import annotations

import io
import logging
import selectors
import socket
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from django.db import connections

from spanner_queues import clock
from spanner_queues.transactions import ConnectionThread, forget_lost_connection
from spanner_queues.worker.events import FINAL_EVENTS, WorkerEvent

if TYPE_CHECKING:
    from spanner_queues.message import Message
    from spanner_queues.worker import Worker
    from spanner_queues.worker.slots import Plan, Slots

logger = logging.getLogger("spanner_queues.worker")

__all__ = ["DEFAULT_STALL_SECONDS", "ProbeServer", "WorkerHealth", "serve"]

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
        #: more readiness checks (the services beside the worker: an inbox's puller)
        self._checks: list[Callable[[], list[str]]] = []

    def add_readiness_check(self, check: Callable[[], list[str]]) -> None:
        """``check()`` says why something beside the worker does not work (empty when it
        does): ``/readyz`` answers 503 with its reasons too. It must answer at once."""
        self._checks.append(check)

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
        problems = self.liveness() + self._databases()
        for check in list(self._checks):
            problems += check()
        return problems

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


#: seconds a connection has to send its whole request, from its accept (then it is closed)
READ_TIMEOUT_SECONDS = 10.0
#: connections held at once while they send their requests; a new one beyond them closes the
#: oldest (the one that has taken longest), never the newest: a probe sends its request at once
MAX_CONNECTIONS = 128
#: bytes of a request's line and headers (a probe's are a few hundred); more closes it
MAX_REQUEST_BYTES = 8192
#: threads answering complete requests (a /readyz may wait on the databases' check)
HANDLER_THREADS = 4
#: connections accepted in one turn of the loop before it reads the ones it holds
_ACCEPTS_PER_TURN = 64


class _Connection:
    __slots__ = ("buffer", "deadline", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline, self.buffer = sock, deadline, b""


class ProbeServer:
    """The probes' HTTP server: one thread and a selector reading every connection, so slow or
    idle connections cost a socket each, never a thread. A connection has ``read_timeout``
    seconds from its accept to send its request line and headers (a deadline for the whole
    request, not for each read); past ``max_connections`` held, the oldest is closed. Complete
    requests go to ``HANDLER_THREADS`` threads, which call the WSGI app and answer with
    ``Connection: close`` (one request per connection, as probes and scrapes make them)."""

    def __init__(
        self,
        listener: socket.socket,
        app: WSGIApp,
        *,
        read_timeout: float,
        max_connections: int,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._listener, self._app = listener, app
        self.read_timeout, self.max_connections = read_timeout, max_connections
        self._monotonic = monotonic
        self.server_address = listener.getsockname()
        self.server_port: int = self.server_address[1]
        listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        #: the connections still sending their requests, oldest first
        self._held: OrderedDict[socket.socket, _Connection] = OrderedDict()
        self._handlers = ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="sq-health")
        #: requests handed to the handlers and not answered yet (at most ``max_connections``)
        self._answering = threading.BoundedSemaphore(max_connections)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        #: connections closed before they sent a request (deadline, cap, size)
        self.dropped = 0

    # --- the loop ---------------------------------------------------------------------------
    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                timeout = 1.0
                if self._held:
                    first = next(iter(self._held.values()))
                    timeout = min(timeout, max(0.0, first.deadline - self._monotonic()))
                for key, _mask in self._selector.select(timeout):
                    if key.data is None:
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._read(key.data)
                self._expire()
        finally:
            for conn in list(self._held.values()):
                self._close(conn)
            self._stopped.set()

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the peer went before the accept, or out of descriptors
                logger.debug("probe server: accept failed", exc_info=True)
                return
            sock.setblocking(False)
            while len(self._held) >= self.max_connections:
                self._close(next(iter(self._held.values())))  # the oldest, not the newest
            conn = _Connection(sock, self._monotonic() + self.read_timeout)
            self._held[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        conn.buffer += data
        end = conn.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.buffer) > MAX_REQUEST_BYTES:
                self._close(conn)
            return
        self._selector.unregister(conn.sock)
        del self._held[conn.sock]
        if not self._answering.acquire(blocking=False):  # a flood of complete requests
            self.dropped += 1
            conn.sock.close()
            return
        try:
            self._handlers.submit(self._answer, conn.sock, conn.buffer[:end])
        except RuntimeError:  # shutting down
            self._answering.release()
            conn.sock.close()

    def _expire(self) -> None:
        now = self._monotonic()
        while self._held:
            oldest = next(iter(self._held.values()))
            if oldest.deadline > now:
                return
            self._close(oldest)

    def _close(self, conn: _Connection) -> None:
        self.dropped += 1
        self._held.pop(conn.sock, None)
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(64):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    # --- one request ------------------------------------------------------------------------
    def _answer(self, sock: socket.socket, head: bytes) -> None:
        try:
            sock.setblocking(True)
            sock.settimeout(self.read_timeout)  # a peer that reads no answer is dropped
            sock.sendall(self._response(head))
        except OSError:
            pass
        except Exception:
            logger.exception("probe server: answering a request failed")
        finally:
            self._answering.release()
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            sock.close()

    def _response(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _plain("400 Bad Request", b"bad request\n")
        method, target, protocol = parts
        path, _, query = target.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": "",
            "PATH_INFO": urllib.parse.unquote(path, "latin-1"),
            "QUERY_STRING": query,
            "SERVER_NAME": str(self.server_address[0]),
            "SERVER_PORT": str(self.server_port),
            "SERVER_PROTOCOL": protocol,
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(b""),
            "wsgi.errors": io.StringIO(),
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
        }
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                key = name.strip().upper().replace("-", "_")
                if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                    key = "HTTP_" + key
                environ[key] = value.strip()
        answer: list[Any] = []

        def start_response(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Any:
            answer[:] = [status, headers]
            return lambda _data: None

        chunks = self._app(environ, start_response)
        try:
            body = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        status, headers = answer
        out = [f"HTTP/1.1 {status}"]
        out += [
            f"{k}: {v}" for k, v in headers if k.lower() not in ("connection", "content-length")
        ]
        out += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        return "\r\n".join(out).encode("latin-1") + (b"" if method == "HEAD" else body)

    # --- stopping ---------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the loop and wait for it (like ``socketserver``'s)."""
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._stopped.wait()

    def server_close(self) -> None:
        self._handlers.shutdown(wait=False)
        self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()


def _plain(status: str, body: bytes) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def serve(
    port: int,
    addr: str,
    health: WorkerHealth,
    fallback: WSGIApp | None = None,
    *,
    read_timeout: float = READ_TIMEOUT_SECONDS,
    max_connections: int = MAX_CONNECTIONS,
) -> tuple[ProbeServer, int]:
    """Serve ``health``'s probes (and ``fallback`` on ``/metrics``) at ``addr:port`` from a
    daemon thread (a ``ProbeServer``); port 0 picks a free one. A connection has
    ``read_timeout`` seconds from its accept to send its request; at most ``max_connections``
    are held while they send it, a new one beyond them closing the oldest. Returns the server
    and its port; ``OSError`` when the port is taken."""
    listener = socket.create_server((addr, port), backlog=128, reuse_port=False)
    server = ProbeServer(
        listener, health.wsgi(fallback), read_timeout=read_timeout, max_connections=max_connections
    )
    thread = threading.Thread(target=server.serve_forever, name="sq-health", daemon=True)
    thread.start()
    return server, server.server_port

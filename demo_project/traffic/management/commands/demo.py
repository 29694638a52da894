"""``manage.py demo`` (what ``bin/demo`` runs): migrate, create an admin login, start the web
server and a queue worker, generate traffic, and stop everything cleanly on Ctrl-C/SIGTERM.

With Pub/Sub at hand (``settings.DEMO_PUBSUB``) it also shows two services connected through
it: unless ``PUBSUB_EMULATOR_HOST`` names one already running, it starts Google's Pub/Sub
emulator on a free loopback port (in its own process group) and creates the topic ``orders``
and the subscription ``orders-shipping``; the worker relays the shop's order events and pulls
them into the shipping service's inbox. The emulator is stopped after the children, at exit.

The web server and the worker are child processes, each in its own process group: a Ctrl-C in
the terminal reaches this process only, which stops the traffic and then sends each child one
SIGTERM (the worker finishes its in-flight messages, acks them and deletes its heartbeat). A
second Ctrl-C makes the worker exit at once. On Linux the children also get SIGTERM if this
process dies without cleaning up.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connections, transaction

from demo_project.traffic.generator import TrafficGenerator
from spanner_queues.testing.pubsub import PubSubEmulator

#: the subscription of the shipping service's inbox, on the orders service's topic
PUBSUB_RESOURCES = "orders-shipping=orders"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def choose_port(preferred: int) -> int:
    """``preferred`` if it is free, else any free port."""
    if preferred and _free(preferred):
        return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Command(BaseCommand):
    help = "Run the demo: web server + queue worker + simulated traffic. Ctrl-C stops it."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--port", type=int, default=8000, help="Preferred port (8000).")
        parser.add_argument("--rate", type=float, default=4.0, help="Traffic: actions a second.")
        parser.add_argument("--no-traffic", action="store_true", help="Generate no traffic.")
        parser.add_argument("--concurrency", type=int, default=3, help="Worker threads.")
        parser.add_argument(
            "--duration", type=float, default=None, help="Stop after this many seconds."
        )
        parser.add_argument(
            "--stop-timeout",
            type=float,
            default=30.0,
            help="Seconds to let the worker finish in-flight messages before aborting it.",
        )

    # --- signals ---------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals += 1
        self.stop.set()
        if self.signals > 1:  # second Ctrl-C: abort the worker too
            self._signal_children(signal.SIGTERM)

    def _signal_children(self, signum: int) -> None:
        """``signum`` to the worker; SIGINT to the web server (runserver exits 0 on it)."""
        for name, proc in self.children.items():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGINT if name == "web server" else signum)

    # --- main ------------------------------------------------------------------------------
    def handle(self, *args: Any, **options: Any) -> None:
        self.stop = threading.Event()
        self.signals = 0
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.traffic: threading.Thread | None = None
        self.pubsub: PubSubEmulator | None = None
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._run(options)
        finally:
            try:
                self._stop_pubsub()
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)

    # --- Pub/Sub ---------------------------------------------------------------------------
    def _start_pubsub(self) -> str:
        """Where Pub/Sub is: the running emulator ``PUBSUB_EMULATOR_HOST`` names, else one
        started here; the topic and subscription are created there if missing."""
        host = os.environ.get("PUBSUB_EMULATOR_HOST")
        if not host:
            self.pubsub = PubSubEmulator()
            host = os.environ["PUBSUB_EMULATOR_HOST"] = self.pubsub.host
        call_command("createpubsubresources", "--topic", PUBSUB_RESOURCES, verbosity=0)
        return host

    def _stop_pubsub(self) -> None:
        if self.pubsub is not None:
            self.pubsub.stop()
            os.environ.pop("PUBSUB_EMULATOR_HOST", None)
            self.stdout.write(f"Stopped the Pub/Sub emulator (pid {self.pubsub.proc.pid}).")
            self.pubsub = None

    def _run(self, options: dict[str, Any]) -> None:
        database = settings.DATABASES["default"]
        where = (
            database["NAME"]
            if settings.DEMO_DATABASE == "sqlite"
            else (f"{settings.DEMO_DATABASE} {os.environ.get('SPANNER_EMULATOR_HOST', '')}".strip())
        )
        self.stdout.write(f"Database: {settings.DEMO_DATABASE} ({where}). Migrating...")
        call_command("migrate", interactive=False, verbosity=0)
        pubsub_host = self._start_pubsub() if settings.DEMO_PUBSUB else None
        username, password = self._admin_login()
        port = choose_port(options["port"])
        logs = Path(settings.VAR) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
        env = dict(os.environ, DJANGO_SETTINGS_MODULE=os.environ["DJANGO_SETTINGS_MODULE"])
        connections.close_all()
        with open(logs / "runserver.log", "ab") as web_log:
            self.children["web server"] = subprocess.Popen(
                [*manage, "runserver", f"127.0.0.1:{port}", "--noreload"],
                stdout=web_log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.children["worker"] = subprocess.Popen(
            [*manage, "runqueueworker", "--concurrency", str(options["concurrency"]), "-v1"],
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            if self._wait_for_web(url, logs / "runserver.log"):
                self._banner(url, username, password, logs, pubsub_host)
                self._serve(options)
        finally:
            self._shutdown(options["stop_timeout"])

    def _admin_login(self) -> tuple[str, str]:
        """The ``admin`` superuser, with a fresh password each run (or DEMO_ADMIN_PASSWORD)."""
        password = os.environ.get("DEMO_ADMIN_PASSWORD") or secrets.token_urlsafe(9)
        with transaction.atomic():  # creating a User sends its welcome message (outbox)
            user = User.objects.filter(username="admin").first()
            if user is None:
                user = User.objects.create_superuser("admin", "admin@example.com", password)
            else:
                user.set_password(password)
                user.save(update_fields=["password"])
        return "admin", password

    def _wait_for_web(self, url: str, log: Path) -> bool:
        while not self.stop.is_set():
            web = self.children["web server"]
            if web.poll() is not None:
                raise CommandError(f"The web server exited ({web.returncode}); see {log}.")
            try:
                with urllib.request.urlopen(f"{url}/admin/login/", timeout=2) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            self.stop.wait(0.2)
        return False

    def _banner(
        self, url: str, username: str, password: str, logs: Path, pubsub_host: str | None
    ) -> None:
        pids = ", ".join(f"{name} pid {proc.pid}" for name, proc in self.children.items())
        pubsub = ""
        if pubsub_host is not None:
            started = f", pid {self.pubsub.proc.pid}" if self.pubsub is not None else ""
            pubsub = (
                f"  Pub/Sub:  emulator at {pubsub_host}{started}: the shop relays each placed "
                "order's event to the topic 'orders', the shipping service's inbox takes it in "
                f"once ({url}/admin/shipping/packingslip/)\n"
            )
        self.stdout.write(
            self.style.SUCCESS(
                f"\nThe demo is running: open {url}/admin/spanner_queues/queues/\n"
                f"  login:    {username}\n  password: {password}\n"
            )
            + f"  ({pids}; web log {logs / 'runserver.log'})\n"
            f"  emails:   {settings.EMAIL_FILE_PATH}\n" + pubsub + "Ctrl-C stops everything.\n"
        )
        self.stdout.flush()

    def _serve(self, options: dict[str, Any]) -> None:
        if not options["no_traffic"]:
            generator = TrafficGenerator(rate=options["rate"], write=self.stdout.write)
            self.traffic = threading.Thread(target=generator.run, args=(self.stop,), name="traffic")
            self.traffic.start()
        deadline = time.monotonic() + options["duration"] if options["duration"] else None
        try:
            while not self.stop.wait(0.5):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                for name, proc in self.children.items():
                    if proc.poll() is not None:
                        self.stderr.write(f"The {name} exited ({proc.returncode}); stopping.")
                        return
        finally:
            self.stop.set()

    def _shutdown(self, timeout: float) -> None:
        self.stop.set()
        self.stdout.write("Stopping: the worker finishes its in-flight messages...")
        # The children first, then the traffic: its action under way (a transaction on the
        # emulator waits its turn) took up to 5 s before the worker even heard of the stop.
        self._signal_children(signal.SIGTERM)
        if self.traffic is not None:
            self.traffic.join()
        deadline = time.monotonic() + timeout
        for name, proc in self.children.items():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"The {name} did not stop in time; killing it.")
                proc.kill()
                proc.wait()
        codes = {name: proc.returncode for name, proc in self.children.items()}
        self.stdout.write(f"Stopped ({', '.join(f'{n} exit {c}' for n, c in codes.items())}).")

"""Google's Pub/Sub emulator for tests (the Debian package ``google-cloud-cli-pubsub-emulator``,
on Java): ``PubSubEmulator`` starts it on a free loopback port in its own process group and
stops the group. Clients reach it through ``PUBSUB_EMULATOR_HOST`` (``PubSubEmulator.env``).
It keeps nothing on disk: topics and subscriptions are made anew per run.
``PubSubEmulator.outage_command`` is a Pub/Sub outage for a fault drill (``queuedrill
--abort-command``): the emulator stopped (SIGSTOP) for some seconds, then continued."""

from __future__ import annotations

import ctypes
import glob
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from spanner_queues.testing.emulator import free_port

__all__ = ["PubSubEmulator", "PubSubEmulatorNotFound", "find_pubsub_emulator"]

#: where the Debian package puts the launcher (``dpkg -L google-cloud-cli-pubsub-emulator``)
CANDIDATES = (
    "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator",
    *sorted(
        glob.glob("/usr/lib/google-cloud-sdk*/platform/pubsub-emulator/bin/cloud-pubsub-emulator")
    ),
)
#: seconds the emulator may take to listen (about 5 measured on the 2-core machine)
START_TIMEOUT = 60.0


class PubSubEmulatorNotFound(RuntimeError):
    """The Pub/Sub emulator's launcher is not installed."""


def find_pubsub_emulator() -> str:
    """The launcher: ``PUBSUB_EMULATOR_BINARY``, else the Debian package's."""
    configured = os.environ.get("PUBSUB_EMULATOR_BINARY")
    if configured:
        return configured
    for candidate in CANDIDATES:
        if Path(candidate).is_file():
            return candidate
    found = shutil.which("cloud-pubsub-emulator")
    if found:
        return found
    raise PubSubEmulatorNotFound(
        "Google's Pub/Sub emulator is not installed: apt-get install "
        "google-cloud-cli-pubsub-emulator (it needs Java 17), or set PUBSUB_EMULATOR_BINARY."
    )


def _own_group_dying_with_parent() -> None:  # pragma: no cover - runs in the child
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: the launcher execs Java, which keeps it
    except OSError:
        pass


class PubSubEmulator:
    """One Pub/Sub emulator process group on ``127.0.0.1:port``; ``stop()`` kills the group."""

    def __init__(self) -> None:
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self._log = tempfile.TemporaryFile()
        self._dir = tempfile.TemporaryDirectory(prefix="sq-pubsub-")
        self.proc = subprocess.Popen(
            [find_pubsub_emulator(), "--host=127.0.0.1", f"--port={self.port}"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self._dir.name,
            preexec_fn=_own_group_dying_with_parent,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the Pub/Sub emulator exited with {self.proc.returncode}: {self.log()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"the Pub/Sub emulator did not listen within {START_TIMEOUT:g} s"
                    ) from None
                time.sleep(0.05)

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs to use this emulator."""
        return {"PUBSUB_EMULATOR_HOST": self.host}

    def outage_command(self, seconds: float) -> str:
        """A shell command that makes an outage of ``seconds``: the emulator's process group
        stopped (SIGSTOP), then continued (SIGCONT). Its connections stay open and nothing
        answers, as a Pub/Sub that hangs: calls run into their deadlines, and what reached it
        meanwhile is served when it goes on. Killed before its end, it leaves the emulator
        stopped: ``resume()`` (a test's teardown) continues it."""
        group = self.proc.pid  # the group's leader (_own_group_dying_with_parent)
        script = (
            f"import os, signal, time\nos.killpg({group}, signal.SIGSTOP)\n"
            f"try:\n    time.sleep({float(seconds)!r})\n"
            f"finally:\n    os.killpg({group}, signal.SIGCONT)\n"
        )
        return f"{shlex.quote(sys.executable)} -c {shlex.quote(script)}"

    def resume(self) -> None:
        """Continue the emulator (SIGCONT), stopped by an ``outage_command`` cut short."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def stop(self) -> None:
        """Kill the emulator's process group and reap the launcher."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self._log.close()
        self._dir.cleanup()

    def __enter__(self) -> PubSubEmulator:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

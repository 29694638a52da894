"""The endurance harness: real ``runqueueworker`` processes on three queues for a given time, with
a steady trickle of sends, receivers that fail sometimes (retries), keys sent again after their
ack, pauses and resumes, ``/readyz`` and ``/livez`` probed every second, and (native) a Spanner
outage in the middle (every call of the front answered UNAVAILABLE; ``--outages N``: N of them,
evenly spaced). Prints, at the start and at
the end, each worker's threads, RSS, open sockets and fds, the database's Spanner sessions
(native: the total, and the harness's own, told apart by the names it created), Spanner
calls per minute while idle (the front's request record) and send-to-ack latency p50/p99;
writes the time series to a JSON file; checks nothing was lost or doubled (one ``SoakEffect``
row per send). With ``--check`` it exits 1 when a worker's threads or RSS
grew beyond the tolerance (``THREAD_SLACK``, ``RSS_TOLERANCE``), a worker took longer than
``EXIT_LIMIT`` to exit after the final SIGTERM, or a message was lost or
doubled.

    .venv/bin/python benchmarks/soak.py --engine native --minutes 60
    .venv/bin/python benchmarks/soak.py --engine native --minutes 2 --check   # CI (bin/test)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: a worker's threads at the end may exceed those at the start by this many (a probe's
#: request thread, a stream restarting), no more
THREAD_SLACK = 3
#: a worker's RSS at the end may exceed that at the start by this fraction (allocator noise
#: after the warm-up), no more
RSS_TOLERANCE = 0.10
#: a worker SIGTERMed at the end must exit within this many seconds (its receivers take
#: milliseconds; the rest is closing streams and sessions), and is killed after ``EXIT_WAIT``
EXIT_LIMIT = 30.0
EXIT_WAIT = 120.0
#: how often (seconds) the sender reads which sent keys are acked (a read of the effects
#: table, whose cost on the emulator grows with its rows)
NOTE_EVERY = 5.0
#: with ``$SOAK_PY_SPY`` and ``--log-dir``: every this many seconds, each worker's stacks
#: are appended to ``worker<n>.stacks`` there
STACKS_EVERY = 600.0
QUEUES = ("soakapp.SoakA", "soakapp.SoakB", "soakapp.SoakC")


def proc_figures(pid: int) -> dict[str, Any]:
    """Threads, RSS (MiB), fds and sockets of process ``pid`` (Linux ``/proc``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    fds = sockets = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        fds += 1
        try:
            sockets += os.readlink(fd).startswith("socket:")
        except OSError:
            pass
    return {
        "threads": int(fields["Threads"]),
        "rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
        "fds": fds,
        "sockets": sockets,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.engine = args.engine
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.sent: dict[str, str] = {}  # send_id -> "sent" | "unknown"
        self.sends: dict[str, tuple[str, str]] = {}  # send_id -> (queue, key)
        self.acked_keys: list[tuple[str, str]] = []
        self.send_errors = 0
        self.probes = {"ok": 0, "503": 0, "error": 0}
        self.series: list[dict[str, Any]] = []
        self.workers: list[tuple[subprocess.Popen[bytes], int, Path]] = []
        self.outage = False
        self.outage_window: tuple[float, float] | None = None
        self.outage_windows: list[tuple[float, float]] = []
        self.idle_calls: list[dict[str, float]] = []
        self.pause_lock = threading.Lock()
        self.stale_acks = 0
        self.undrained = 0  # sends with no effect whose message is still queued at the end
        #: seconds of each send's transaction since the last sample
        self.send_seconds: list[float] = []
        #: names of the Spanner sessions this process (the harness) created: the sessions the
        #: database lists are the workers' and these (``track_own_sessions``)
        self.own_sessions: set[str] = set()

    # --- setup ----------------------------------------------------------------------------
    def setup(self, tmp: Path) -> None:
        os.environ["SQ_SOAK_ENGINE"] = self.engine
        os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.soak_settings"
        if self.engine == "sqlite":
            os.environ["SQ_DATABASE_NAME"] = str(tmp / "soak.sqlite3")
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection

        if self.engine == "sqlite":
            call_command("migrate", verbosity=0)
        else:
            connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
            os.environ["SQ_DATABASE_NAME"] = str(connection.settings_dict["NAME"])
        self.front = None
        if self.engine == "native":
            from spanner_queues_emulator.faults import FrontControl

            self.front = FrontControl(os.environ["SPANNER_EMULATOR_HOST"])
            self.track_own_sessions()

    def track_own_sessions(self) -> None:
        """Note the name of every Spanner session this process creates (its connections',
        multiplexed or pooled), so that ``sessions`` tells the harness's from the workers'."""
        from google.cloud.spanner_v1.session import Session

        create, own = Session.create, self.own_sessions

        def tracked(session: Any, *args: Any, **kwargs: Any) -> Any:
            result = create(session, *args, **kwargs)
            own.add(session.name)
            return result

        Session.create = tracked  # type: ignore[method-assign]

    def start_workers(self, tmp: Path) -> None:
        for n in range(self.args.workers):
            port = free_port()
            log = Path(self.args.log_dir or tmp) / f"worker{n}.log"
            proc = subprocess.Popen(
                [sys.executable, "-m", "django", "runqueueworker", *QUEUES,
                 "--health-port", str(port), "-v1"],
                env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                stdout=log.open("wb"), stderr=subprocess.STDOUT,
            )  # fmt: skip
            self.workers.append((proc, port, log))
        for proc, port, log in self.workers:
            deadline = time.monotonic() + 120
            while self.probe(port, "/readyz") != 200:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"worker did not become ready:\n{log.read_text()}")
                time.sleep(0.2)

    # --- load -----------------------------------------------------------------------------
    @staticmethod
    def probe(port: int, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0

    def prober(self) -> None:
        while not self.stop.wait(1.0):
            for _, port, _ in self.workers:
                for path in ("/readyz", "/livez"):
                    status = self.probe(port, path)
                    key = "ok" if status == 200 else "503" if status == 503 else "error"
                    with self.lock:
                        self.probes[key] += 1

    def model(self, label: str) -> Any:
        from django.apps import apps

        return apps.get_model(label)

    def send_one(self, rng: random.Random) -> None:
        from django.db import transaction

        from spanner_queues.exceptions import CommitOutcomeUnknown, MessageAlreadyExists

        label = rng.choice(QUEUES)
        reuse = None
        with self.lock:
            if self.acked_keys and rng.random() < 0.2:
                reuse = self.acked_keys.pop(rng.randrange(len(self.acked_keys)))
        if reuse is not None:
            label, key = reuse
        else:
            key = uuid.uuid4().hex[:16]
        send_id = uuid.uuid4().hex
        payload = {
            "send_id": send_id,
            "sent_at": time.time(),
            "fail_below": 2 if rng.random() < 0.1 else 0,
        }
        try:
            with transaction.atomic():
                self.model(label).send(id=key, payload=payload)
        except MessageAlreadyExists:
            return  # the key's previous message is not acked yet
        except CommitOutcomeUnknown:
            with self.lock:
                self.sent[send_id] = "unknown"
            return
        except Exception:
            with self.lock:
                self.send_errors += 1
            from django.db import connections

            connections.close_all()
            return
        with self.lock:
            self.sent[send_id] = "sent"
            self.sends[send_id] = (label, key)
            self.pending_keys.append((label, key, send_id))

    def sender(self) -> None:
        """Send at ``--rate``, timing each send's transaction (the database's own speed: the
        emulator's cost grows with every row it ever held); every ``NOTE_EVERY`` seconds,
        note which keys may be sent again."""
        rng = random.Random(7)
        interval = 1.0 / self.args.rate
        next_note = 0.0
        while not self.stop.is_set():
            if self.idle.is_set():
                time.sleep(0.2)
                continue
            began = time.perf_counter()
            self.send_one(rng)
            with self.lock:
                self.send_seconds.append(time.perf_counter() - began)
            if time.monotonic() >= next_note:
                self.note_acked()
                next_note = time.monotonic() + NOTE_EVERY
            self.stop.wait(interval)

    def note_acked(self) -> None:
        """Keys whose effect committed (so their message is acked) may be sent again."""
        from benchmarks.soakapp.models import SoakEffect

        with self.lock:
            pending = list(self.pending_keys)
        if len(pending) < 20:
            return
        try:
            done = set(
                SoakEffect.objects.filter(send_id__in=[p[2] for p in pending]).values_list(
                    "send_id", flat=True
                )
            )
        except Exception:
            return
        with self.lock:
            for item in pending:
                if item[2] in done:
                    self.pending_keys.remove(item)
                    self.acked_keys.append((item[0], item[1]))

    def pauser(self) -> None:
        from spanner_queues import controls

        rng = random.Random(11)
        while not self.stop.wait(self.args.pause_every):
            model = self.model(rng.choice(QUEUES))
            with self.pause_lock:  # an idle window waits for the resume
                if self.idle.is_set():
                    continue
                try:
                    controls.pause(model)
                    self.stop.wait(5)
                    controls.resume(model)
                except Exception:
                    pass

    # --- measures -------------------------------------------------------------------------
    def spanner_database(self) -> Any:
        """The google-cloud-spanner ``Database`` behind the harness's own connection (it
        connects when it must)."""
        from django.db import connection

        connection.ensure_connection()
        return connection.connection.database

    def sessions(self) -> dict[str, int] | None:
        """The database's Spanner sessions: ``total``, and ``harness``, those this process
        created (the rest are the workers')."""
        if self.engine != "native":
            return None
        try:
            database = self.spanner_database()
            names = [s.name for s in database.spanner_api.list_sessions(database=database.name)]
        except Exception:
            return None
        return {"total": len(names), "harness": sum(1 for n in names if n in self.own_sessions)}

    def read_ms(self) -> float | None:
        """The median time (ms) of three strong single-use reads of ``SELECT 1``: the
        emulator's own floor under every read. Google's emulator dates each read ahead of its
        clock's drift, which grows with every call it has served, and waits until the wall
        clock gets there (GoogleCloudPlatform/cloud-spanner-emulator#277;
        ``benchmarks/emulator_aging.py``): a worker's latency grows by it however well the
        worker keeps."""
        if self.engine != "native":
            return None
        try:
            database = self.spanner_database()
            took = []
            for _ in range(3):
                began = time.perf_counter()
                with database.snapshot() as snapshot:
                    list(snapshot.execute_sql("SELECT 1"))
                took.append(time.perf_counter() - began)
            return round(statistics.median(took) * 1e3, 1)
        except Exception:
            return None

    def idle_calls_per_minute(self, seconds: float) -> float | None:
        """Spanner calls per minute the workers make while nothing is sent (the front's
        record; the harness's own calls are none while it only waits)."""
        if self.front is None:
            return None
        self.idle.set()
        try:
            with self.pause_lock:
                pass
            self.wait_for_effects(60)  # retries due, failures' back-offs
            time.sleep(2)
            self.front.clear()
            self.front.record(True)
            time.sleep(seconds)
            recorded = self.front.requests()
            self.front.record(False)
            self.front.clear()
        finally:
            self.idle.clear()
        kinds: dict[str, int] = {}
        for call in recorded:
            sql = call.sql or ""
            kind = call.method + (f" {sql.split()[0]}" if sql and sql.split()[0].isupper() else "")
            if "RECEIVE_" in sql:
                kind = call.method + " RECEIVE"
            elif "RENEWLEASE_" in sql:
                kind = call.method + " RENEWLEASE"
            kinds[kind] = kinds.get(kind, 0) + 1
        self.idle_calls.append({k: round(v * 60 / seconds, 1) for k, v in sorted(kinds.items())})
        return round(len(recorded) * 60 / seconds, 1)

    def snapshot(self, label: str) -> dict[str, Any]:
        figures = {
            "at_s": round(time.monotonic() - self.started, 1),
            "label": label,
            "workers": [proc_figures(proc.pid) for proc, _, _ in self.workers],
            "sessions": self.sessions(),
            "read_ms": self.read_ms(),
            "sent": len(self.sent),
            "outage": self.outage,
        }
        return figures

    def sampler(self) -> None:
        next_dump = time.monotonic() + STACKS_EVERY
        while not self.stop.wait(self.args.sample_every):
            if self.args.log_dir and time.monotonic() >= next_dump:
                next_dump += STACKS_EVERY
                for proc, _, log in self.workers:
                    self.dump_stacks(proc, log.with_suffix(".stacks"))
            if self.idle.is_set():  # no call of the harness's own in an idle window
                continue
            try:
                sample = self.snapshot("sample")
                now = time.time()  # the sends of the window before the last one: acked by now
                sample["latency"] = self.latencies(
                    now - 2 * self.args.sample_every, now - self.args.sample_every
                )
                with self.lock:
                    took, self.send_seconds = self.send_seconds, []
                sample["send_ms"] = round(statistics.median(took) * 1e3, 1) if took else None
                self.series.append(sample)
            except Exception as exc:
                self.series.append({"error": repr(exc)})

    def do_outage(self) -> None:
        seconds = self.args.outage_seconds
        if self.front is None or seconds <= 0:
            return
        methods = (
            "ExecuteStreamingSql",
            "ExecuteSql",
            "Commit",
            "BeginTransaction",
            "ExecuteBatchDml",
            "CreateSession",
            "BatchCreateSessions",
            "Rollback",
        )
        for method in methods:
            self.front.fail(method, "UNAVAILABLE", "soak: outage", times=10**9)
        self.outage = True
        time.sleep(seconds)
        self.front.clear()
        self.outage = False
        self.outage_window = (time.time() - seconds, time.time())
        self.outage_windows.append(self.outage_window)

    # --- the run --------------------------------------------------------------------------
    def run(self) -> int:
        args = self.args
        with tempfile.TemporaryDirectory(prefix="sq-soak-") as tmp_name:
            tmp = Path(tmp_name)
            self.setup(tmp)
            self.pending_keys: list[tuple[str, str, str]] = []
            self.idle = threading.Event()
            self.start_workers(tmp)
            self.started = time.monotonic()
            threads = [threading.Thread(target=t, daemon=True)
                       for t in (self.prober, self.sender, self.pauser, self.sampler)]  # fmt: skip
            for t in threads:
                t.start()
            try:
                return self._measure(tmp)
            finally:
                self.stop.set()
                for proc, _, _ in self.workers:
                    proc.terminate()
                for proc, _, log in self.workers:
                    try:
                        proc.wait(120)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                    if args.logs:
                        print(log.read_text()[-4000:])

    def _measure(self, tmp: Path) -> int:
        args = self.args
        total = args.minutes * 60
        idle_window = min(30.0, max(10.0, total / 10))
        warm_up = min(60.0, total / 6)  # imports, first sessions, first streams
        window = max(warm_up, min(60.0, total / 6))  # sends whose latency each end shows
        time.sleep(warm_up)
        start = self.snapshot("start")
        start["idle_calls_per_minute"] = self.idle_calls_per_minute(idle_window)
        begun = time.time()
        # (the window of the start's latency: after the idle window, when no sample is taken)
        begun_at = time.monotonic() - self.started
        time.sleep(window)
        start["latency"] = self.latencies(begun, time.time())
        start["send_ms"] = self.send_ms(begun_at, begun_at + window)
        self.steady_threads(start, begun_at, begun_at + window)
        end_at = self.started + total - idle_window - 5
        # the outages evenly between the start's window and the end's (one: in the middle)
        first, last = time.monotonic(), end_at - window
        for i in range(args.outages):
            at = first + (i + 1) * (last - first) / (args.outages + 1)
            if args.outages == 1:
                at = self.started + total / 2
            time.sleep(max(0.0, at - time.monotonic()))
            self.do_outage()
        time.sleep(max(0.0, end_at - time.monotonic()))
        end = self.snapshot("end")
        end["latency"] = self.latencies(time.time() - window, time.time())
        end["send_ms"] = self.send_ms(end["at_s"] - window, end["at_s"])
        self.steady_threads(end, end["at_s"] - window, end["at_s"])
        end["idle_calls_per_minute"] = self.idle_calls_per_minute(idle_window)
        self.stop.set()
        lost, doubled, unknown, details = self.drain()
        if end["latency"]["n"] < 2:  # their effects may have committed only now
            end["latency"] = self.latencies(begun, time.time())
        exit_seconds = self.stop_workers()
        result = {
            "engine": self.engine,
            "minutes": args.minutes,
            "start": start,
            "end": end,
            "sent": len(self.sent),
            "lost": lost,
            "still_queued": self.undrained,
            "doubled": doubled,
            "unknown_outcome": unknown,
            "stale_acks_by_key": self.stale_acks,
            "send_errors": self.send_errors,
            "probes": self.probes,
            "idle_calls_by_kind": self.idle_calls,
            "outage_window": self.outage_window,
            "outage_windows": self.outage_windows,
            "lost_and_doubled": details,
            "series": self.series,
            "exit_seconds": exit_seconds,
        }
        Path(args.json).write_text(json.dumps(result, indent=1))
        return self.report(result)

    def stop_workers(self) -> list[float | None]:
        """SIGTERM every worker at once, as an orchestrator stops a pod: each one's seconds
        to exit (None: still running after ``EXIT_WAIT``; killed by ``run``'s cleanup)."""
        for proc, _, _ in self.workers:
            proc.terminate()
        sent = time.monotonic()
        seconds: list[float | None] = []
        for proc, _, _ in self.workers:
            try:
                proc.wait(max(0.0, sent + EXIT_LIMIT - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.dump_stacks(proc)
            try:
                proc.wait(max(0.0, sent + EXIT_WAIT - time.monotonic()))
                seconds.append(round(time.monotonic() - sent, 1))
            except subprocess.TimeoutExpired:
                seconds.append(None)
        return seconds

    @staticmethod
    def dump_stacks(proc: subprocess.Popen[bytes], to: Path | None = None) -> None:
        """The stacks of a worker's threads, from ``py-spy dump`` (the program named by
        ``$SOAK_PY_SPY``; nothing without it), appended to ``to`` (None: printed, for a worker
        still running ``EXIT_LIMIT`` after SIGTERM)."""
        py_spy = os.environ.get("SOAK_PY_SPY")
        if not py_spy or proc.poll() is not None:
            return
        dump = subprocess.run(
            [py_spy, "dump", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=60
        )
        text = f"--- {time.strftime('%H:%M:%S')} worker pid {proc.pid}\n{dump.stdout}{dump.stderr}"
        if to is None:
            print(f"  still running {EXIT_LIMIT:g} s after SIGTERM:\n{text}")
        else:
            with to.open("a") as out:
                out.write(text)

    def wait_for_effects(self, seconds: float) -> None:
        """Wait (at most ``seconds``) until every send so far has its effect."""
        from benchmarks.soakapp.models import SoakEffect

        deadline = time.monotonic() + seconds
        with self.lock:
            wanted = {k for k, v in self.sent.items() if v == "sent"}
        while time.monotonic() < deadline:
            try:
                done = set(SoakEffect.objects.values_list("send_id", flat=True).distinct())
            except Exception:
                done = set()
            if wanted <= done:
                return
            time.sleep(1)

    def samples(self, low: float, high: float) -> list[dict[str, Any]]:
        """The samples of the series taken between ``low`` and ``high`` seconds into the run
        (not the failed ones)."""
        return [x for x in self.series if "workers" in x and low <= x["at_s"] <= high]

    def steady_threads(self, snap: dict[str, Any], low: float, high: float) -> None:
        """Each worker's threads in ``snap``: the median of the samples between ``low`` and
        ``high`` seconds into the run and ``snap`` itself, not one reading (a RECEIVE stream
        starts and ends two threads as its queue is paused and resumed, a probe's request
        has one); the reading is kept as ``threads_now``."""
        samples = self.samples(low, high)
        for i, figures in enumerate(snap["workers"]):
            values = [figures["threads"]] + [x["workers"][i]["threads"] for x in samples]
            figures["threads_now"] = figures["threads"]
            figures["threads"] = int(statistics.median(values))

    def send_ms(self, low: float, high: float) -> float | None:
        """The median of the samples' send times (ms) between ``low`` and ``high`` seconds
        into the run; None when no sample was taken then (in a run of two minutes the end's
        window may have none: the outage holds the sampler's reads up to 30 s)."""
        values = [x["send_ms"] for x in self.samples(low, high) if x["send_ms"] is not None]
        return round(statistics.median(values), 1) if values else None

    def latencies(self, low: float, high: float) -> dict[str, Any]:
        """Send-to-ack p50/p99 (ms) of the first-attempt messages sent between ``low`` and
        ``high`` (``time.time()``) that are acked by now."""
        from benchmarks.soakapp.models import SoakEffect

        values = sorted(
            h - s
            for s, h in SoakEffect.objects.filter(
                sent_at__gte=low, sent_at__lt=high, attempt__lte=1
            ).values_list("sent_at", "handled_at")
        )
        if len(values) < 2:
            return {"p50_ms": None, "p99_ms": None, "n": len(values)}
        q = statistics.quantiles(values, n=100)
        return {"p50_ms": round(q[49] * 1e3, 1), "p99_ms": round(q[98] * 1e3, 1), "n": len(values)}

    def drain(self) -> tuple[int, int, int, list[dict[str, Any]]]:
        """Wait (up to ``--drain-seconds``) for every send to have its effect; then count, and
        describe each lost or doubled send (its effects and its key's other sends)."""
        from django.db.models import Count

        from benchmarks.soakapp.models import SoakEffect

        sent = {k for k, v in self.sent.items() if v == "sent"}
        deadline = time.monotonic() + self.args.drain_seconds
        while True:
            counts = dict(
                SoakEffect.objects.values("send_id")
                .annotate(n=Count("id"))
                .values_list("send_id", "n")
            )
            lost = sent - counts.keys()
            if not lost or time.monotonic() > deadline:
                break
            time.sleep(2)
        doubled = {k for k, n in counts.items() if n > 1}
        unknown = sum(1 for v in self.sent.values() if v == "unknown")
        queued = self.still_queued(lost)
        self.undrained = len(queued)
        lost -= queued.keys()
        details = [
            {"send_id": send_id, "what": "still queued", **message}
            for send_id, message in sorted(queued.items())
        ]
        for send_id in sorted(lost | doubled):
            label, key = self.sends.get(send_id, ("?", "?"))
            effects = list(
                SoakEffect.objects.filter(key=key).values(
                    "send_id", "queue", "attempt", "pid", "sent_at", "handled_at"
                )
            )
            details.append(
                {
                    "send_id": send_id,
                    "what": "lost" if send_id in lost else "doubled",
                    "queue": label,
                    "key": key,
                    "sends_of_key": [i for i, v in self.sends.items() if v == (label, key)],
                    "effects_of_key": effects,
                }
            )
        # A delivery whose lease expired (the outage stops renewals) may still commit: where
        # acks are by key alone (native Spanner: docs/explanation/guarantees.md), its ack then
        # deletes the newer message sent under the key since: that send is lost, the older one
        # doubled. Counted apart; a loss or double of any other shape is a fault.
        from spanner_queues.engines import engines

        if not engines["default"].features.supports_lease_checked_ack:
            order = {i: n for n, i in enumerate(self.sends)}
            for item in details:
                if item["what"] != "lost":
                    continue
                earlier = [
                    other
                    for other in details
                    if other["what"] == "doubled"
                    and not other.get("pair")
                    and (other["queue"], other["key"]) == (item["queue"], item["key"])
                    and order.get(other["send_id"], 0) < order.get(item["send_id"], 0)
                ]
                if earlier:
                    item["pair"] = earlier[-1]["pair"] = "stale ack by key"
            stale = {d["send_id"] for d in details if d.get("pair")}
            lost -= stale
            doubled -= stale
            self.stale_acks = sum(1 for d in details if d.get("pair") and d["what"] == "lost")
        return len(lost), len(doubled), unknown, details

    def still_queued(self, send_ids: set[str]) -> dict[str, dict[str, Any]]:
        """Of ``send_ids`` (sends with no effect), those whose message is still in its queue
        under its key, undelivered or not yet acked: a backlog the drain did not reach, not a
        loss. Each with its attempts and deliver time."""
        from spanner_queues.admin.browse import get_messages

        by_queue: dict[str, list[tuple[str, str]]] = {}
        for send_id in send_ids:
            label, key = self.sends.get(send_id, ("?", "?"))
            by_queue.setdefault(label, []).append((send_id, key))
        found: dict[str, dict[str, Any]] = {}
        for label, items in by_queue.items():
            if label == "?":
                continue
            for message in get_messages(self.model(label), [(key,) for _, key in items]):
                send_id = message.json().get("send_id")
                if send_id in send_ids:
                    found[send_id] = {
                        "queue": label,
                        "key": message.key[0],
                        "attempt": message.attempt,
                        "deliver_time": str(message.deliver_time),
                    }
        return found

    def report(self, result: dict[str, Any]) -> int:
        start, end = result["start"], result["end"]
        print(f"soak: {result['engine']}, {result['minutes']} min, {len(self.workers)} workers, "
              f"{result['sent']} messages sent ({result['send_errors']} sends failed in the "
              f"outage, {result['unknown_outcome']} of unknown outcome)")  # fmt: skip
        for name, snap in (("start", start), ("end", end)):
            for i, w in enumerate(snap["workers"]):
                print(f"  {name:5} worker {i}: threads {w['threads']}, RSS {w['rss_mib']} MiB, "
                      f"fds {w['fds']}, sockets {w['sockets']}")  # fmt: skip
            lat = snap["latency"]
            sessions = snap["sessions"] or {}
            print(f"  {name:5} sessions {sessions.get('total')} (the harness's "
                  f"{sessions.get('harness')}), idle calls/min "
                  f"{snap['idle_calls_per_minute']}, latency p50 {lat['p50_ms']} ms, "
                  f"p99 {lat['p99_ms']} ms (n={lat['n']}); a send's transaction "
                  f"{snap.get('send_ms')} ms, a strong read {snap.get('read_ms')} ms (the "
                  "database's own speed)")  # fmt: skip
        print(
            f"  probes: {result['probes']}; lost {result['lost']} ({result['still_queued']} more"
            f" still queued when the drain ended), doubled {result['doubled']}"
            f" (and {result['stale_acks_by_key']} re-sent key(s) whose newer message a stale"
            " delivery's ack by key deleted: native acks are by key alone)"
        )
        print(f"  series: {self.args.json}")
        failures = []
        for i, (a, b) in enumerate(zip(start["workers"], end["workers"], strict=True)):
            if b["threads"] > a["threads"] + THREAD_SLACK:
                failures.append(f"worker {i}: threads {a['threads']} -> {b['threads']}")
            if b["rss_mib"] > a["rss_mib"] * (1 + RSS_TOLERANCE):
                failures.append(f"worker {i}: RSS {a['rss_mib']} -> {b['rss_mib']} MiB")
        if result["lost"] or result["doubled"]:
            failures.append(f"lost {result['lost']}, doubled {result['doubled']}")
        print(f"  exit after SIGTERM: {result['exit_seconds']} s")
        for i, took in enumerate(result["exit_seconds"]):
            if took is None or took > EXIT_LIMIT:
                failures.append(f"worker {i}: exit after SIGTERM took {took or '> 120'} s")
        for failure in failures:
            print(f"  GROWTH/LOSS/EXIT: {failure}")
        return 1 if failures and self.args.check else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("native", "sqlite", "postgres"), default="native")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=5.0, help="sends per second")
    parser.add_argument("--outage-seconds", type=float, default=30.0)
    parser.add_argument(
        "--outages", type=int, default=1, help="outages, evenly spaced (default: one, midway)"
    )
    parser.add_argument("--pause-every", type=float, default=45.0)
    parser.add_argument("--sample-every", type=float, default=10.0)
    parser.add_argument("--drain-seconds", type=float, default=180.0)
    parser.add_argument("--json", default="soak.json", help="the time series and figures")
    parser.add_argument("--check", action="store_true", help="exit 1 on growth or loss")
    parser.add_argument("--logs", action="store_true", help="print the workers' log tails")
    parser.add_argument("--log-dir", help="keep the workers' logs in this folder")
    sys.exit(Soak(parser.parse_args()).run())


if __name__ == "__main__":
    main()

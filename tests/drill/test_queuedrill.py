"""``manage.py queuedrill`` (``spanner_queues.contrib.drill``) on whichever database the suite
runs: real ``runqueueworker`` children, SIGKILLed during the drain; the report is written and
says 0 lost, 0 handled twice. Kept small: the emulator runs one read-write transaction at a
time."""

from __future__ import annotations

import json
import os
import shlex
import sys
import xml.etree.ElementTree as ET
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from spanner_queues.contrib.drill import runner
from spanner_queues.contrib.drill.models import DrillEffect, DrillMessage, DrillOrdered
from spanner_queues.engines import engine_for

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

ON_EMULATOR = bool(os.environ.get("SPANNER_EMULATOR_HOST"))
#: messages of the drill in CI
SMALL = int(os.environ.get("SQ_DRILL_MESSAGES", 30 if ON_EMULATOR else 120))


class DrillRun:
    """Runs ``queuedrill`` in this process (its workers use the test's database)."""

    def __init__(self, report: Path) -> None:
        self.report = report

    def __call__(self, *args: str) -> tuple[dict, str]:
        """The report's ``report.json`` as a dict, and the command's output."""
        out = StringIO()
        call_command("queuedrill", "--report-dir", str(self.report), *args, stdout=out)
        return json.loads((self.report / "report.json").read_text()), out.getvalue()


@pytest.fixture
def drill(child_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DrillRun:
    for name, value in child_env.items():
        monkeypatch.setenv(name, value)
    return DrillRun(tmp_path / "report")


def test_drill_with_sigkills_loses_nothing_handles_nothing_twice_and_writes_its_report(
    drill: DrillRun,
) -> None:
    figures, output = drill(
        "--messages",
        str(SMALL),
        "--workers",
        "2",
        "--kills",
        "2",
        "--lease",
        "1",
        # (40 ms a message: the drain outlasts the workers' 1 s summary lines, which the run
        # commits per message are read from; at 5 ms group commit drained it before any)
        "--work-ms",
        "40",
        "--sample-interval",
        "0.2",
        "--timeout",
        "240",
        "--seed",
        "7",
    )
    assert figures["sent"] == SMALL
    assert figures["kills"] == 2
    assert (figures["lost"], figures["twice"]) == (0, 0), figures
    assert figures["handled"] == SMALL and figures["drained"] is True
    assert "PASS: sent=" in output
    report = drill.report
    text = (report / "report.md").read_text()
    assert text.startswith("# Queue fault drill: PASS")
    assert "| **lost** (sent, never handled) | **0** |" in text
    assert "| kills (SIGKILL) | 2 |" in text
    assert "| run commits per message (the workers' last summary lines) |" in text
    assert figures["commits_per_message"] is not None  # (the workers' summary lines say)
    svg = ET.parse(report / "depth.svg").getroot()
    assert svg.tag.endswith("svg")
    assert sum(1 for e in svg.iter() if e.tag.endswith("line") and e.get("stroke") == "#c0392b")
    started = 2 + figures["kills"] + figures["unexpected_exits"]  # each replaced
    assert len(list((report / "workers").iterdir())) == started
    # the drill stops each survivor with one SIGTERM (a second one exits at once, unacked)
    for log in (report / "workers").iterdir():
        assert "SIGTERM received again" not in log.read_text(), log.name
    # the run's effect rows are counted, then deleted; the queue is empty
    assert not DrillEffect.objects.exists()
    assert not DrillMessage.objects.exists()


def test_a_missing_and_a_doubled_effect_are_counted_and_fail_the_drill(
    drill: DrillRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counting is real: one message's effect row removed, another's doubled, after the
    drain and before the count, make the drill report 1 lost and 1 twice and exit non-zero."""
    count = runner.Drill._count

    def tampered(self: runner.Drill) -> None:
        first, second = f"{self.run_id}-0000000", f"{self.run_id}-0000001"
        DrillEffect.objects.filter(run=self.run_id, key=first).delete()
        DrillEffect.objects.create(run=self.run_id, key=second, worker="tampered")
        count(self)

    monkeypatch.setattr(runner.Drill, "_count", tampered)
    with pytest.raises(CommandError, match="lost or handled twice"):
        drill(
            "--messages",
            "3",
            "--workers",
            "1",
            "--kills",
            "0",
            "--sample-interval",
            "0.2",
            "--timeout",
            "120",
        )
    figures = json.loads((drill.report / "report.json").read_text())
    assert (figures["lost"], figures["twice"], figures["handled"]) == (1, 1, 2)
    text = (drill.report / "report.md").read_text()
    assert text.startswith("# Queue fault drill: FAIL")
    assert "-0000000`" in text and "-0000001`" in text


def test_drill_terminating_the_workers_postgresql_sessions_loses_nothing(
    drill: DrillRun,
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("pg-terminate ends PostgreSQL sessions (pg_terminate_backend)")
    figures, _ = drill(
        "--messages",
        str(SMALL),
        "--workers",
        "2",
        "--kills",
        "1",
        "--lease",
        "1",
        "--work-ms",
        "20",
        "--abort-method",
        "pg-terminate",
        "--abort-every",
        "0.5",
        "--sample-interval",
        "0.2",
        "--timeout",
        "240",
        "--seed",
        "3",
    )
    assert figures["aborts"] >= 1, figures["events"]
    assert (figures["lost"], figures["twice"], figures["drained"]) == (0, 0, True), figures


@pytest.mark.engine_independent
def test_abort_every_without_a_method_is_refused() -> None:
    with pytest.raises(CommandError, match="--abort-every needs"):
        call_command("queuedrill", "--abort-every", "1", stdout=StringIO())


def test_drill_restarting_a_local_postgresql_server_loses_nothing(drill: DrillRun) -> None:
    """``--abort-method command``: the test's private cluster (tests/postgres_server.py) is
    restarted under the workers with ``pg_ctl restart``, twice or more."""
    if connection.vendor != "postgresql":
        pytest.skip("restarts the suite's private PostgreSQL cluster (pg_ctl)")
    from tests.postgres_server import find_postgres

    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        [(data,)] = cursor.fetchall()
    log = Path(data).parent / "server.log"
    restart = f"{find_postgres() / 'pg_ctl'} -D {data} -l {log} -m fast -w restart"
    if os.geteuid() == 0:  # the cluster runs as SQ_PG_USER (PostgreSQL refuses root)
        restart = f"runuser -u {os.environ.get('SQ_PG_USER', 'nobody')} -- {restart}"
    figures, _ = drill(
        *("--messages", str(SMALL), "--workers", "2", "--kills", "1", "--lease", "1"),
        *("--work-ms", "20", "--abort-method", "command", "--abort-command", restart),
        *("--abort-every", "1", "--sample-interval", "0.2", "--timeout", "240", "--seed", "5"),
    )
    restarts = [e for e in figures["events"] if e["kind"] == "abort"]
    assert restarts and all(e["detail"].endswith("exited with 0") for e in restarts), restarts
    assert (figures["lost"], figures["twice"], figures["drained"]) == (0, 0, True), figures


@pytest.mark.engine_independent  # the workers never reach the database
def test_workers_that_cannot_start_make_the_drill_give_up_and_fail(drill: DrillRun) -> None:
    with pytest.raises(CommandError, match="did not drain"):
        drill("--messages", "2", "--workers", "1", "--kills", "0", "--worker-arg=--bogus")
    figures = json.loads((drill.report / "report.json").read_text())
    assert figures["unexpected_exits"] == 3 and figures["drained"] is False
    assert figures["lost"] == 2
    assert figures["events"][-1]["kind"] == "gave-up"


def test_the_report_records_the_seed_the_versions_and_the_host(drill: DrillRun) -> None:
    """Without ``--seed`` the drill draws one and records it, with the versions of the app,
    Django, the driver and the database server and the host, in both files and the command
    line to run it again."""
    import django

    import spanner_queues

    figures, _ = drill("--messages", "3", "--workers", "1", "--kills", "0", "--timeout", "120")
    seed = figures["options"]["seed"]
    assert isinstance(seed, int)
    environment = figures["environment"]
    assert environment["spanner_queues"] == spanner_queues.__version__
    assert environment["django"] == django.get_version()
    assert environment["driver"] and environment["database_server"]
    assert environment["host"] and environment["python"]
    text = (drill.report / "report.md").read_text()
    assert f"--seed={seed}" in text
    for value in environment.values():
        assert str(value) in text, value


def test_a_database_with_other_data_is_refused_unless_allowed(drill: DrillRun) -> None:
    """The drill stalls other writers on SQLite and loads any database: a database holding
    rows of other apps (a production one) is refused before anything is sent."""
    from tests.testapp.models import Account

    Account.objects.create(name="a customer")
    with pytest.raises(CommandError, match="does not look like a drill's database"):
        drill("--messages", "3", "--workers", "1", "--kills", "0")
    assert not DrillMessage.objects.exists()
    figures, _ = drill(
        "--messages", "3", "--workers", "1", "--kills", "0", "--allow-shared-database"
    )
    assert figures["drained"] is True and figures["options"]["allow_shared_database"] is True


@pytest.mark.engine_independent
def test_the_abort_command_is_bounded_by_the_timeout(drill: DrillRun) -> None:
    """An ``--abort-command`` that hangs is ended when the drill's time is up (a drill with
    ``--timeout 5`` ran 26.6 s, and one whose command never ends ran for ever)."""
    with pytest.raises(CommandError):
        drill(
            *("--messages", "2", "--workers", "1", "--kills", "0", "--timeout", "3"),
            *("--abort-method", "command", "--abort-command", "sleep 3600", "--abort-every", "0.1"),
            *("--worker-arg=--bogus",),  # workers that cannot start: the queue never drains
        )
    figures = json.loads((drill.report / "report.json").read_text())
    [abort] = [e for e in figures["events"] if e["kind"] == "abort"]
    assert "--abort-command timed out after" in abort["detail"], abort


def test_commit_figures_weigh_each_workers_last_summary_line(tmp_path: Path) -> None:
    """Run commits per message and messages per group over the workers: each log's last
    summary line, weighted by the messages it processed; a log without one adds nothing."""
    one, two, none = tmp_path / "1.log", tmp_path / "2.log", tmp_path / "3.log"
    one.write_text(
        "processed=10 failed=0 commits/msg=1.00 rate=1/s\n"
        "processed=100 failed=0 timed_out=0 commits/msg=0.10 group=10.0 rate=5.0/s\n"
    )
    two.write_text("processed=300 failed=0 commits/msg=0.05 group=20.0 rate=9/s\n")
    none.write_text("started\n")
    per_message, size = runner.commit_figures([one, two, none, tmp_path / "missing.log"])
    assert per_message == pytest.approx((10 + 15) / 400)
    assert size == pytest.approx(400 / (10 + 15))
    assert runner.commit_figures([none]) == (None, None)


def _outage_command(seconds: float) -> str | None:
    """A shell command that takes the database away for ``seconds`` under the workers: on
    SQLite an exclusive lock on the file, on PostgreSQL a restart of the suite's private
    cluster, behind the queue-aware front (native queues) every call answered UNAVAILABLE;
    None where the suite has none (the table engine on the bare emulator)."""
    python = sys.executable
    if connection.vendor == "sqlite":
        name = connection.settings_dict["NAME"]
        script = (
            f"import sqlite3, time; c = sqlite3.connect({name!r}, isolation_level=None, "
            "timeout=30); "
            f"c.execute('BEGIN EXCLUSIVE'); time.sleep({seconds!r}); c.execute('COMMIT')"
        )
        return f"{python} -c {shlex.quote(script)}"
    if connection.vendor == "postgresql":
        from tests.postgres_server import find_postgres

        with connection.cursor() as cursor:
            cursor.execute("SHOW data_directory")
            [(data,)] = cursor.fetchall()
        log = Path(data).parent / "server.log"
        restart = f"{find_postgres() / 'pg_ctl'} -D {data} -l {log} -m fast -w restart"
        if os.geteuid() == 0:  # the cluster runs as SQ_PG_USER (PostgreSQL refuses root)
            restart = f"runuser -u {os.environ.get('SQ_PG_USER', 'nobody')} -- {restart}"
        return restart
    if engine_for(DrillOrdered).features.supports_native_queues:
        script = (
            "import os, time; from spanner_queues_emulator.faults import FrontControl; "
            "c = FrontControl(os.environ['SPANNER_EMULATOR_HOST']); "
            "[c.fail(m, 'UNAVAILABLE', 'outage', times=100000) for m in "
            "('ExecuteStreamingSql', 'ExecuteSql', 'Commit', 'BeginTransaction')]; "
            f"time.sleep({seconds!r}); c.clear()"
        )
        return f"{python} -c {shlex.quote(script)}"
    return None


def test_ordered_drill_with_sigkills_and_an_outage_keeps_each_streams_order(
    drill: DrillRun,
) -> None:
    """``queuedrill --ordered``: streams of numbered messages on an ordered queue, workers
    SIGKILLed and the database taken away under them; each stream ran in send order, one at a
    time, each message once."""
    outage = _outage_command(2.0)
    # every 3 s (jittered 1.5-4.5 s) on the quick databases; on native queues, whose drain is
    # slower, every 8 s: outages every few seconds cost each lease that many renewals, and the
    # back-off of the leases lost grows past the drill's timeout
    native = engine_for(DrillOrdered).features.supports_native_queues
    every = "8" if native else "3"
    figures, output = drill(
        *("--ordered", "--streams", "4", "--messages", str(SMALL), "--workers", "2"),
        *("--kills", "2", "--lease", "1", "--work-ms", "5", "--sample-interval", "0.2"),
        *("--timeout", "300", "--seed", "13"),
        *(
            ("--abort-method", "command", "--abort-command", outage, "--abort-every", every)
            if outage
            else ()
        ),
    )
    assert figures["mode"] == "ordered"
    assert figures["kills"] == 2
    if outage:
        assert figures["aborts"] >= 1, figures["events"]
    assert (figures["lost"], figures["twice"], figures["order_violations"]) == (0, 0, []), figures
    assert figures["handled"] == SMALL and figures["drained"] is True
    assert "order_violations=0" in output
    assert (
        "| **out of order** (a gap, an inversion or a double in a stream) | **0** |"
        in (drill.report / "report.md").read_text()
    )


def test_an_ordered_drill_counts_a_stream_run_out_of_order_and_fails(
    drill: DrillRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order check is real: an effect that says its stream had not reached the message
    before it fails the drill."""
    count = runner.OrderedDrill._count

    def tampered(self: runner.OrderedDrill) -> None:
        rows = DrillEffect.objects.filter(run=self.run_id, seq=2)
        rows.filter(pk=rows.values_list("pk", flat=True)[:1]).delete()
        DrillEffect.objects.create(
            run=self.run_id, key=f"{self.run_id}-s000-0000002", worker="tampered", seq=2, after=0
        )
        count(self)

    monkeypatch.setattr(runner.OrderedDrill, "_count", tampered)
    with pytest.raises(CommandError, match="a stream ran out of order"):
        drill(
            *("--ordered", "--streams", "1", "--messages", "3", "--workers", "1"),
            *("--kills", "0", "--sample-interval", "0.2", "--timeout", "120"),
        )
    figures = json.loads((drill.report / "report.json").read_text())
    assert figures["order_violations"] == [
        "s000: message 2 ran before the one before it (its stream had reached 0)"
    ]


def test_a_drain_quicker_than_abort_every_still_has_its_first_abort_in_it(
    drill: DrillRun,
) -> None:
    """Asked for aborts, a drill gets at least one inside the drain, however fast the database:
    the first falls at a random point of 10-50 % of the batch handled when that comes before its
    time (as the kill points do), so a quick drain is not reported as surviving outages it never
    had."""
    outage = _outage_command(0.5)
    if outage is None:
        pytest.skip("no outage command on this engine")
    figures, _ = drill(
        *("--messages", str(SMALL), "--workers", "1", "--kills", "0", "--seed", "3"),
        *("--abort-method", "command", "--abort-command", outage, "--abort-every", "600"),
        *("--timeout", "300", "--sample-interval", "0.1"),
    )
    assert figures["aborts"] == 1, figures["events"]
    assert (figures["lost"], figures["twice"]) == (0, 0), figures
    assert figures["drained"] is True

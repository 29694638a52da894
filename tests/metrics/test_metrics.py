"""The metrics app (``spanner_queues.contrib.metrics``) in process: the verbs' counts on commit,
the worker listener, the queue gauges, the view, the setting, its checks, and the Grafana
dashboard's metric names."""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core import checks
from django.db import transaction
from django.utils import timezone
from prometheus_client import REGISTRY, generate_latest

from spanner_queues import api
from spanner_queues.contrib import metrics
from spanner_queues.contrib.metrics import exporter
from spanner_queues.contrib.metrics.conf import check_setting, parse_metrics
from spanner_queues.exceptions import InvalidQueueEngine, QueueError
from spanner_queues.message import Message
from spanner_queues.worker import WorkerEvent
from tests.testapp.models import Jobs

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t0ken-of-sixteen-or-more"
Q = "testapp.Jobs"


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture(autouse=True)
def on() -> None:
    metrics.enable()


# --- counted by the verbs -------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_a_send_dropped_by_unique_for_is_counted_as_dropped_not_sent() -> None:
    from datetime import timedelta

    sent, dropped = (
        "spanner_queues_message_send_count_total",
        "spanner_queues_message_send_dropped_count_total",
    )
    before = value(sent, queue=Q), value(dropped, queue=Q)
    Jobs.send(id="once", unique_for=timedelta(hours=1))
    with transaction.atomic():
        assert Jobs.send(id="once", unique_for=timedelta(hours=1)).dropped
        assert value(dropped, queue=Q) == before[1]  # not yet committed
    assert (value(sent, queue=Q), value(dropped, queue=Q)) == (before[0] + 1, before[1] + 1)


@pytest.mark.django_db(transaction=True)
def test_a_send_is_counted_when_its_transaction_commits_and_never_if_it_rolls_back() -> None:
    name = "spanner_queues_message_send_count_total"
    before = value(name, queue=Q)
    with transaction.atomic():
        Jobs.send_many([{"payload": "a"}, {"payload": "b"}])
        assert value(name, queue=Q) == before  # not yet committed
    assert value(name, queue=Q) == before + 2
    with pytest.raises(RuntimeError), transaction.atomic():
        Jobs.send(payload="c")
        raise RuntimeError
    assert value(name, queue=Q) == before + 2
    api.replace(Jobs, {"id": "r"}, payload="d")
    assert value(name, queue=Q) == before + 3


@pytest.mark.django_db(transaction=True)
def test_an_ack_is_counted_when_its_transaction_commits() -> None:
    name = "spanner_queues_message_ack_count_total"
    Jobs.send_many([{"id": "a"}, {"id": "b"}])
    before = value(name, queue=Q)
    with pytest.raises(RuntimeError), transaction.atomic():
        api.ack_many(Jobs, [("a",)])
        raise RuntimeError
    assert value(name, queue=Q) == before
    api.ack_many(Jobs, [("a",), ("b",)])
    assert value(name, queue=Q) == before + 2


# --- the worker listener --------------------------------------------------------------------
def _message(key: str) -> Message:
    return Message(
        queue=Q, key=(key,), key_names=("id",), payload=b"", deliver_time=timezone.now(), attempt=1
    )


def test_the_listener_observes_the_messages_of_each_commit() -> None:
    """Group commit: each run's commit observes how many messages it acked; commits per
    message is the histogram's count over its sum."""
    listen = metrics.WorkerMetrics()
    name = "spanner_queues_worker_commit_messages"
    count, total = value(f"{name}_count", queue=Q), value(f"{name}_sum", queue=Q)
    for size in (20, 20, 1):
        listen(WorkerEvent(name="committed", worker_id="w", queue=Q, size=size))
    assert value(f"{name}_count", queue=Q) == count + 3
    assert value(f"{name}_sum", queue=Q) == total + 41
    assert value(f"{name}_bucket", queue=Q, le="1.0") >= 1


def test_the_listener_counts_outcomes_in_flight_durations_and_leases() -> None:
    listen = metrics.WorkerMetrics()
    outcome = "spanner_queues_worker_messages_total"
    names = {
        "acked": value(outcome, queue=Q, outcome="acked"),
        "failed": value(outcome, queue=Q, outcome="failed"),
        "dead_lettered": value(outcome, queue=Q, outcome="dead_lettered"),
        "unmatched": value(outcome, queue=Q, outcome="unmatched"),
        "ack": value("spanner_queues_message_ack_count_total", queue=Q),
        "runs": value(
            "spanner_queues_worker_receiver_duration_seconds_count", queue=Q, receiver="r"
        ),
        "lost": value("spanner_queues_worker_leases_lost_total", queue=Q),
        "renewed": value("spanner_queues_worker_lease_renewals_total", queue=Q),
    }
    in_flight = "spanner_queues_worker_in_flight_messages"
    a, b, c = _message("a"), _message("b"), _message("c")

    def emit(name: str, message: Message, **info: object) -> None:
        listen(WorkerEvent(name=name, worker_id="w", message=message, **info))

    base = value(in_flight, queue=Q)
    for m in (a, b, c):
        emit("received", m)
        emit("started", m, receiver="r")
    assert value(in_flight, queue=Q) == base + 3
    emit("renewed", a)
    emit("acked", a, receiver="r", duration=0.5)
    emit("failed", b, receiver="r", duration=0.1, error=RuntimeError())
    emit("dead_lettered", b)  # after its last failed run: in flight only once
    emit("renewal_failed", c)
    emit("lease_lost", c)  # the same lost lease: counted once
    emit("received", a)
    emit("unmatched", a)  # no receiver of this worker matched it: given back, not in flight
    assert value(in_flight, queue=Q) == base
    assert value(outcome, queue=Q, outcome="acked") == names["acked"] + 1
    assert value(outcome, queue=Q, outcome="failed") == names["failed"] + 1
    assert value(outcome, queue=Q, outcome="dead_lettered") == names["dead_lettered"] + 1
    assert value(outcome, queue=Q, outcome="unmatched") == names["unmatched"] + 1
    # acks are counted on the verbs' signal alone (the worker's acks send it): not from events
    assert value("spanner_queues_message_ack_count_total", queue=Q) == names["ack"]
    assert (
        value("spanner_queues_worker_receiver_duration_seconds_count", queue=Q, receiver="r")
        == names["runs"] + 2
    )
    assert value("spanner_queues_worker_leases_lost_total", queue=Q) == names["lost"] + 1
    assert value("spanner_queues_worker_lease_renewals_total", queue=Q) == names["renewed"] + 1
    emit("lease_lost", _message("d"))  # lost before it started: no renewal had failed
    assert value("spanner_queues_worker_leases_lost_total", queue=Q) == names["lost"] + 2
    assert value(in_flight, queue=Q) == base


@pytest.mark.django_db(transaction=True)
def test_a_receiver_acking_its_own_message_is_counted_once() -> None:
    """The verbs' ``messages_acked`` is sent on commit, still inside the receiver's run: the
    counter leaves out what the worker reports acked itself, in the receiver's transaction
    (atomic), in autocommit (non-atomic) or in the receiver's own ``atomic()`` block."""
    from spanner_queues.worker import Worker
    from tests.workerapp.models import WorkItems

    queue = WorkItems._meta.label
    name = "spanner_queues_message_ack_count_total"
    before = value(name, queue=queue)
    WorkItems.send_many(
        [
            {"id": "atomic", "payload": {"ack_itself": True}},
            {"id": "external", "payload": {"mode": "external", "ack_itself": True}},
            {"id": "own", "payload": {"own_transaction": True}},
        ]
    )
    Worker(
        [WorkItems], burst=True, install_signal_handlers=False, listeners=[metrics.WorkerMetrics()]
    ).run()
    assert not WorkItems.objects.exists()
    assert value(name, queue=queue) == before + 3


@pytest.mark.django_db(transaction=True)
def test_the_workers_own_acks_are_counted_on_the_verbs_signal_without_a_listener(
    tmp_path: Path,
) -> None:
    """An ack is counted on one channel, the verbs' ``messages_acked``, whoever made it: the
    worker's ack of a finished message and a ``Retry``'s ack-and-send count with no
    ``WorkerMetrics`` listener (they were counted from its events only, so not at all)."""
    from spanner_queues.worker import Worker
    from tests.workerapp.models import WorkItems

    queue = WorkItems._meta.label
    acks, sends = (
        "spanner_queues_message_ack_count_total",
        "spanner_queues_message_send_count_total",
    )
    WorkItems.send_many(
        [
            {"id": "done", "payload": {}},
            {"id": "again", "payload": {"retry_after": 0, "trace": str(tmp_path / "trace")}},
        ]
    )
    before = {name: value(name, queue=queue) for name in (acks, sends)}
    Worker([WorkItems], burst=True, install_signal_handlers=False).run()
    assert not WorkItems.objects.exists()
    # "done", the Retry's ack of "again", then "again" acked at its second run
    assert value(acks, queue=queue) == before[acks] + 3
    assert value(sends, queue=queue) == before[sends] + 1  # the Retry's re-send


def test_a_failing_queue_is_counted_and_shown_failing_until_it_recovers() -> None:
    listen = metrics.WorkerMetrics()
    errors = "spanner_queues_worker_receive_errors_total"
    failing = "spanner_queues_worker_queue_failing"
    before = value(errors, queue=Q)
    for _ in range(3):
        listen(WorkerEvent(name="receive_failed", worker_id="w", queue=Q, error=KeyError()))
    assert value(errors, queue=Q) == before + 3
    assert value(failing, queue=Q) == 1
    listen(WorkerEvent(name="queue_recovered", worker_id="w", queue=Q))
    assert value(failing, queue=Q) == 0
    assert value(errors, queue=Q) == before + 3


# --- gauges ---------------------------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_the_gauges_read_engine_stats_of_every_queue() -> None:
    Jobs.send_many([{"payload": "a"}, {"payload": "b"}])
    gauges = exporter.gauges()
    gauges.refresh()
    assert value("spanner_queues_buffered_ready_messages", queue=Q) == 2
    assert value("spanner_queues_queue_messages", queue=Q, state="total") == 2
    assert value("spanner_queues_oldest_unacked_message_age_seconds", queue=Q) >= 0
    Jobs.send(payload="c")
    gauges.refresh(max_age=3600)  # read recently: not read again
    assert value("spanner_queues_buffered_ready_messages", queue=Q) == 2
    gauges.refresh()
    assert value("spanner_queues_buffered_ready_messages", queue=Q) == 3


@pytest.mark.django_db
def test_an_unreachable_database_costs_one_deadline_per_refresh_not_one_per_queue(
    monkeypatch,
) -> None:
    from spanner_queues.engines import engines
    from spanner_queues.engines.stats import stats_cache
    from spanner_queues.exceptions import QueueUnavailable

    calls = []

    def unreachable(self, model):
        calls.append(model)
        raise QueueUnavailable("the database did not answer within the deadline")

    monkeypatch.setattr(type(engines["default"]), "stats", unreachable)
    stats_cache.clear()
    try:
        assert metrics.QueueGauges().refresh() == []
    finally:
        stats_cache.clear()
    assert len(calls) == 1


def test_every_metric_name_is_exported() -> None:
    text = generate_latest(REGISTRY).decode()
    assert metrics.METRIC_NAMES <= set(exporter.metric_names_in(text))


def test_without_prometheus_client_the_error_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, exporter.__name__)  # (put back afterwards)
    with pytest.raises(metrics.MetricsUnavailable, match=r"spanner-queues\[metrics\]") as info:
        importlib.import_module(exporter.__name__)
    assert isinstance(info.value, QueueError)


# --- the view -------------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_view_is_off_by_default(client, settings) -> None:
    assert not hasattr(settings, "SPANNER_QUEUES_METRICS")
    assert client.get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 404


@pytest.mark.django_db
def test_the_view_wants_a_token_or_staff(client, settings, django_user_model) -> None:
    settings.SPANNER_QUEUES_METRICS = {"VIEW": True, "TOKEN": TOKEN}
    assert client.get("/metrics/").status_code == 403
    assert client.get("/metrics/", HTTP_AUTHORIZATION="Bearer wrong-token-wrong").status_code == 403
    response = client.get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert 'spanner_queues_buffered_ready_messages{queue="testapp.Jobs"}' in response.text
    user = django_user_model.objects.create_user("u", password="pw", is_staff=False)
    client.force_login(user)
    assert client.get("/metrics/").status_code == 403
    user.is_staff = True
    user.save()
    assert client.get("/metrics/").status_code == 200


@pytest.mark.parametrize(
    "raw",
    [
        [],
        {"VIEW": True, "TOKN": "x"},
        {"TOKEN": "short"},
        {"SAMPLE_INTERVAL_SECONDS": 0},
        {"SAMPLE_INTERVAL_SECONDS": "30"},
        {"SAMPLE_INTERVAL_SECONDS": 0.001},  # ~550 depth samples a second on SQLite
        {"VIEW": "False"},  # a string would read as true
        {"VIEW": 1},
        {"RECORD_DEPTH_SAMPLES": "no"},
        {"TOKEN": " " * 24},
        {"TOKEN": "sixteen-or-more chars with spaces"},
    ],
)
def test_a_wrong_setting_says_why(raw) -> None:
    with pytest.raises(InvalidQueueEngine, match="SPANNER_QUEUES_METRICS"):
        parse_metrics(raw)


def test_setting_defaults() -> None:
    params = parse_metrics(None)
    assert (params.view, params.token, params.sample_interval) == (False, None, 30.0)
    assert params.record_depth_samples


def test_the_view_setting_switches_counting_on_when_the_process_starts() -> None:
    """A web process with ``VIEW`` on counts its sends from the start, not only once it has
    served an authorised scrape (which is what called ``enable()`` before)."""
    import subprocess

    code = (
        "import django, tests.settings as base\n"
        "from django.conf import settings\n"
        "settings.configure(**{k: getattr(base, k) for k in dir(base) if k.isupper()},"
        f" SPANNER_QUEUES_METRICS={{'VIEW': {{view}}, 'TOKEN': {TOKEN!r}}})\n"
        "django.setup()\n"
        "from spanner_queues.contrib import metrics\n"
        "print(metrics.enabled())\n"
    )
    for view, expected in (("True", "True"), ("False", "False")):
        proc = subprocess.run(
            [sys.executable, "-c", code.replace("{view}", view)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            env={"PATH": "", "PYTHONPATH": str(ROOT)},
        )
        assert proc.stdout.strip() == expected, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "raw",
    [
        {"VIEW": True, "TOKEN": "short"},  # a 500 on every scrape
        {"VIEW": "False"},
        {"VIEW": True, "TOKEN": " " * 20},
        {"SAMPLE_INTERVAL_SECONDS": 0.001},
        {"VIEW": True, "TOKN": TOKEN},
    ],
)
def test_manage_py_check_reports_a_wrong_metrics_setting_with_a_hint(settings, raw) -> None:
    settings.SPANNER_QUEUES_METRICS = raw
    [error] = check_setting()
    assert error.id == "spanner_queues.E201" and "SPANNER_QUEUES_METRICS" in error.msg
    assert error.hint
    assert error.id in {e.id for e in checks.run_checks()}  # (registered by the app)


def test_the_setting_or_the_worker_flag_without_the_app_installed_says_so(
    settings, monkeypatch
) -> None:
    from django.apps import apps
    from django.core.management import CommandError, call_command

    from spanner_queues.checks import check_metrics_app

    settings.SPANNER_QUEUES_METRICS = {"VIEW": True, "TOKEN": TOKEN}
    assert check_metrics_app() == []  # installed here
    installed = apps.is_installed
    app = "spanner_queues.contrib.metrics"
    monkeypatch.setattr(apps, "is_installed", lambda name: name != app and installed(name))
    [error] = check_metrics_app()
    assert error.id == "spanner_queues.E203" and repr(app) in error.msg and error.hint
    with pytest.raises(CommandError, match=r"--metrics-port needs the metrics app.*INSTALLED_APPS"):
        call_command("runqueueworker", "--metrics-port", "0", "--burst")
    del settings.SPANNER_QUEUES_METRICS
    assert check_metrics_app() == []


def test_without_the_app_in_installed_apps_check_and_the_worker_say_so() -> None:
    """The real registry without the app: ``check`` reports E203 (no traceback) and
    ``runqueueworker --metrics-port`` ends with the command error, before receiving."""
    import subprocess

    code = (
        "import django, tests.settings as base\n"
        "from django.conf import settings\n"
        "from django.core.management import call_command\n"
        "own = {k: getattr(base, k) for k in dir(base) if k.isupper()}\n"
        "own['INSTALLED_APPS'].remove('spanner_queues.contrib.metrics')\n"
        f"settings.configure(**own, SPANNER_QUEUES_METRICS={{'VIEW': True, 'TOKEN': {TOKEN!r}}})\n"
        "django.setup()\n"
        "for args in (['check'], ['runqueueworker', '--metrics-port', '0', '--burst']):\n"
        "    try:\n"
        "        call_command(*args)\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "", "PYTHONPATH": str(ROOT)},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out, out
    assert "SystemCheckError" in out and "spanner_queues.E203" in out, out
    assert "CommandError --metrics-port needs the metrics app" in out, out


@pytest.mark.parametrize("interval", ["0.001", "0.5", "0"])
def test_a_metrics_interval_below_one_second_is_refused(interval) -> None:
    from django.core.management import CommandError

    from spanner_queues.management.commands.runqueueworker import Command

    parser = Command().create_parser("manage.py", "runqueueworker")
    with pytest.raises(CommandError, match=r"--metrics-interval.*at least 1"):
        parser.parse_args(["--metrics-port", "0", "--metrics-interval", interval])
    assert parser.parse_args(["--metrics-interval", "1"]).metrics_interval == 1.0


# --- docs -----------------------------------------------------------------------------------
def _names(text: str) -> set[str]:
    found = set(re.findall(r"spanner_queues_[a-z_]+", text))
    return {re.sub(r"_(bucket|count|sum)$", "", n) if "duration" in n else n for n in found}


@pytest.fixture
def dashboard() -> Iterator[dict]:
    yield json.loads((ROOT / "docs/grafana/spanner_queues.json").read_text())


def test_the_grafana_dashboard_names_only_metrics_that_exist(dashboard: dict) -> None:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    used = _names(" ".join(exprs))
    assert used <= metrics.METRIC_NAMES, used - metrics.METRIC_NAMES
    # the five of Spanner's are all on it
    assert {
        "spanner_queues_buffered_ready_messages",
        "spanner_queues_message_send_count_total",
        "spanner_queues_message_ack_count_total",
        "spanner_queues_oldest_unacked_message_age_seconds",
        "spanner_queues_lease_expiration_count_total",
    } <= used


def test_the_alert_rules_and_the_howto_name_only_metrics_that_exist() -> None:
    for path in ("docs/prometheus/alerts.yml", "docs/howto/metrics.md"):
        used = _names((ROOT / path).read_text())
        assert used and used <= metrics.METRIC_NAMES, (path, used - metrics.METRIC_NAMES)


# --- the depth sampling command -------------------------------------------------------------
@pytest.mark.django_db(transaction=True)  # (native queues' stats read committed rows)
def test_recordqueuedepth_stores_one_sample_per_queue() -> None:
    from io import StringIO

    from django.core.management import call_command

    from spanner_queues.monitoring import QueueDepthSample

    Jobs.send_many([{"payload": "a"}, {"payload": "b"}])
    out = StringIO()
    call_command("recordqueuedepth", "testapp.Jobs", stdout=out)
    assert "testapp.Jobs: total 2" in out.getvalue()
    assert QueueDepthSample.objects.get(queue=Q).total == 2
    call_command("recordqueuedepth", "testapp.Jobs", "--min-interval", "3600", stdout=out)
    assert QueueDepthSample.objects.filter(queue=Q).count() == 1


@pytest.mark.django_db
def test_with_a_multiprocess_dir_the_view_adds_up_the_processes_files(
    client, settings, monkeypatch, tmp_path
) -> None:
    """prometheus-client's multiprocess mode (several web processes): the view reads the
    processes' files (none here: this process does not write any) and its own gauges."""
    settings.SPANNER_QUEUES_METRICS = {"VIEW": True, "TOKEN": TOKEN}
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    Jobs.send(payload="a")
    response = client.get("/metrics/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert 'spanner_queues_buffered_ready_messages{queue="testapp.Jobs"}' in response.text
    assert "process_cpu_seconds_total" not in response.text  # not the default registry

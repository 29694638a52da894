"""The public API is exported once: the public modules (``docs/reference/api.md``, "Public
modules") export exactly the names pinned here, each name resolves, an object is exported by one
public module (plus at most the package top, ``spanner_queues``), and the docs, the README and
the demo project import only public names of public modules."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import spanner_queues
from spanner_queues import exceptions

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine_independent  # the code and the pages, no database

#: module -> its ``__all__``; every other module of the package is private
PUBLIC: dict[str, set[str]] = {
    "spanner_queues": {"QueueError", "Retry", "__version__", "receiver"},
    "spanner_queues.models": {
        "JSONPayloadField", "Queue", "QueueManager", "QueueQuerySet", "Queues",
    },
    "spanner_queues.api": {
        "ack", "ack_many", "cancel", "is_paused", "pause", "receive", "release", "renew",
        "renew_many", "replace", "requeue", "requeue_many", "resume", "row_to_message", "send",
        "send_many",
    },
    "spanner_queues.deadletter": {"dead_letter", "dead_letter_queue_for", "replay", "sources_of"},
    "spanner_queues.message": {"Message", "OutgoingMessage"},
    "spanner_queues.causes": {"FailureCause", "causes_of", "fingerprint"},
    "spanner_queues.exceptions": {
        name
        for name, value in vars(exceptions).items()
        if isinstance(value, type) and value.__module__ == exceptions.__name__
    },
    "spanner_queues.receivers": {
        "MessageContext", "NoReceiver", "ReceiverConfigurationError", "ReceiverRegistry",
        "ReceiverSpec", "current_run", "receiver", "receivers",
    },
    "spanner_queues.queues": {"get_queue", "queue_models"},
    "spanner_queues.patterns": {
        "Cron", "Schedule", "beat", "cancel", "checkpoint", "next_run", "periodic",
        "resend_later", "schedules", "seed", "seed_schedules", "window_deliver_time",
    },
    "spanner_queues.outbox": {
        "EVENTS", "KeyBuilder", "OutboxQuerySet", "PayloadBuilder", "Registration",
        "manual_send", "register", "registrations", "send_for", "unregister",
    },
    "spanner_queues.monitoring": {"SAMPLE_RETENTION", "QueueDepthSample", "record_depth_samples"},
    "spanner_queues.engines": {
        "BaseQueueEngine", "EngineFeatures", "QueueStats", "engine_for", "engines",
    },
    "spanner_queues.transactions": {"run_in_transaction"},
    "spanner_queues.operations": {"CreateQueue", "DeleteQueue"},
    "spanner_queues.clock": {"Source", "install", "installed", "now", "uninstall"},
    "spanner_queues.worker": {
        "FINAL_EVENTS", "MAX_CONCURRENCY", "MAX_PREFETCH", "PARKED_UNTIL", "QueueHealth",
        "STUCK_GRACE_SECONDS", "Worker", "WorkerEvent", "WorkerEvents", "WorkerStats",
        "on_stop", "recycle_connections",
    },
    "spanner_queues.admin": {"QueuesAdmin"},
    "spanner_queues.testing": {
        "ClockNotMovable", "Drained", "MovableClock", "Outcome", "assert_sent",
        "clock_is_movable", "drain", "moved_clock", "sent",
    },
    "spanner_queues.testing.emulator": {
        "EmulatorNotFound", "QueueEmulator", "ensure_database", "ensure_emulator",
        "ensure_instance", "find_emulator", "free_port", "start_emulator",
        "start_queue_emulator",
    },
    "spanner_queues.testing.pubsub": {
        "PubSubEmulator", "PubSubEmulatorNotFound", "find_pubsub_emulator",
    },
    "spanner_queues.signals": {
        "inbox_duplicates_dropped", "inbox_pull_failed", "inbox_pulled", "messages_acked",
        "messages_cancelled", "messages_published", "messages_sent", "publish_failed",
        "sends_dropped", "worker_stopped",
    },
    "spanner_queues.contrib.tasks": {
        "QueueBackend", "TaskMessage", "TaskResultRecord", "was_dropped",
    },
    "spanner_queues.contrib.pubsub": {"PublishFailed", "SeenEvent", "event_id"},
    "spanner_queues.contrib.metrics": {
        "METRIC_NAMES", "MetricsUnavailable", "QueueGauges", "WorkerMetrics", "enable",
        "enabled", "metrics_view", "serve", "wsgi_app",
    },
    "spanner_queues.contrib.tracing": {"MESSAGING_SYSTEM", "QueueTracing"},
}  # fmt: skip

#: public by a dotted path the docs give (an ``ENGINE``, a command to subclass, a pytest
#: plugin), not by an ``__all__``: module -> the names users reach in it
ENTRY_POINTS: dict[str, set[str]] = {
    "spanner_queues.engines.table": {"TableQueueEngine"},
    "spanner_queues.engines.native": {"NativeQueueEngine"},
    "spanner_queues.management.commands.runqueueworker": {"Command"},
    "spanner_queues.testing.pytest_plugin": set(),
    "spanner_queues.testing.conformance": set(),
    "spanner_queues.contrib.drill": set(),
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_a_public_module_exports_exactly_its_pinned_names(module: str) -> None:
    exported = importlib.import_module(module).__all__
    assert len(exported) == len(set(exported)), f"{module}.__all__ repeats a name"
    assert set(exported) == PUBLIC[module], (
        f"{module}.__all__ changed: pin it here and in docs/reference/api.md"
    )


@pytest.mark.parametrize("module", sorted(PUBLIC.keys() | ENTRY_POINTS.keys()))
def test_every_public_name_resolves(module: str) -> None:
    imported = importlib.import_module(module)
    names = PUBLIC.get(module, set()) | ENTRY_POINTS.get(module, set())
    assert [n for n in sorted(names) if not hasattr(imported, n)] == []


def test_an_object_is_exported_by_one_public_module_and_at_most_the_package_top() -> None:
    exporters: dict[int, list[str]] = {}
    for module, names in PUBLIC.items():
        imported = importlib.import_module(module)
        for name in names:
            value = getattr(imported, name)
            if isinstance(value, (str, int, float, tuple, frozenset, type(None))):
                continue  # constants: equal values are not one object exported twice
            exporters.setdefault(id(value), []).append(f"{module}.{name}")
    twice = [
        paths
        for paths in exporters.values()
        if len([p for p in paths if p.rsplit(".", 1)[0] != "spanner_queues"]) > 1
    ]
    assert twice == [], "exported by more than one public module: " + ", ".join(
        " = ".join(sorted(paths)) for paths in twice
    )
    # the package top re-exports, it does not define: the same objects as their homes
    assert spanner_queues.QueueError is exceptions.QueueError
    assert spanner_queues.Retry is exceptions.Retry
    assert spanner_queues.receiver is importlib.import_module("spanner_queues.receivers").receiver


def test_reference_lists_the_public_modules() -> None:
    """docs/reference/api.md's "Public modules" table names exactly these modules."""
    text = (ROOT / "docs" / "reference" / "api.md").read_text()
    section = text.split("## Public modules\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(spanner_queues[\w.]*)`", section, re.M))
    assert listed == PUBLIC.keys() | ENTRY_POINTS.keys()


IMPORT = re.compile(r"^\s*from (spanner_queues(?:\.\w+)*) import \(?([\w, \n]+?)\)?\s*$", re.M)


def _user_facing_sources() -> list[Path]:
    return [
        *sorted((ROOT / "docs").rglob("*.md")),
        ROOT / "README.md",
        *sorted((ROOT / "demo_project").rglob("*.py")),
    ]


def test_docs_readme_and_demo_import_only_public_names() -> None:
    public = PUBLIC.keys() | ENTRY_POINTS.keys()
    found, wrong = 0, []
    for path in _user_facing_sources():
        for module, names in IMPORT.findall(path.read_text()):
            for name in (n.strip() for n in names.replace("\n", " ").split(",")):
                if not name:
                    continue
                found += 1
                if f"{module}.{name}" in public:  # a public module imported by name
                    continue
                if name in PUBLIC.get(module, set()) | ENTRY_POINTS.get(module, set()):
                    continue
                wrong.append(f"{path.relative_to(ROOT)}: from {module} import {name}")
    assert found > 30
    assert wrong == [], "private names in user-facing imports:\n" + "\n".join(wrong)

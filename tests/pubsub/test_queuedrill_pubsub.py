"""``manage.py queuedrill --pubsub``: the fault drill through the relay, Pub/Sub (the emulator)
and the inbox, with real ``runqueueworker`` relay and inbox processes SIGKILLed and SIGTERMed on
the drill's schedule. Its report checks every event's effect in service B exactly once, nothing
left in either queue, in Pub/Sub or dead-lettered, and counts the duplicates the inbox dropped.
``--ordered``: numbered streams through an ordered outbox, Pub/Sub ordering keys and an ordered
inbox, under kills and Pub/Sub outages (the emulator stopped), each stream's sequence checked at
the inbox's receiver."""

from __future__ import annotations

import json
import os
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from google.cloud import pubsub_v1

from spanner_queues.contrib.drill.models import DrillEffect
from spanner_queues.contrib.drill.pubsub import runner
from spanner_queues.contrib.drill.pubsub.models import (
    DrillEvent,
    DrillEventDead,
    DrillInbox,
    DrillOrderedEvent,
    DrillOrderedEventDead,
    DrillOrderedInbox,
)
from spanner_queues.contrib.pubsub.models import SeenEvent
from spanner_queues.engines import engine_for

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


class DrillRun:
    """Runs ``queuedrill --pubsub`` in this process (its workers use the test's database and
    the test's Pub/Sub project)."""

    def __init__(self, report: Path) -> None:
        self.report = report

    def __call__(self, *args: str) -> tuple[dict, str]:
        out = StringIO()
        call_command("queuedrill", "--pubsub", "--report-dir", str(self.report), *args, stdout=out)
        return self.figures(), out.getvalue()

    def figures(self) -> dict:
        return json.loads((self.report / "report.json").read_text())


@pytest.fixture
def drill(pubsub, child_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DrillRun:
    for name, value in pubsub.env(child_env).items():
        monkeypatch.setenv(name, value)
    return DrillRun(tmp_path / "report")


QUICK = ("--sample-interval", "0.2", "--timeout", "240")


def test_pubsub_drill_killing_relay_and_inbox_workers_passes_its_report(drill: DrillRun) -> None:
    figures, output = drill(
        *("--messages", "40", "--workers", "1", "--kills", "4", "--signal", "mixed"),
        *("--lease", "2", "--work-ms", "5", "--seed", "11", *QUICK),
    )
    assert figures["mode"] == "pubsub" and figures["passed"] is True, figures
    assert figures["kills"] + figures["terms"] == 4
    assert (figures["sent"], figures["handled"]) == (40, 40)
    assert (figures["lost"], figures["twice"], figures["left_in_queue"]) == (0, 0, 0)
    assert (figures["left_on_subscription"], figures["dead_lettered"]) == (0, 0)
    assert figures["published"] >= 40 and figures["duplicates_dropped"] >= 0
    killed = {e["detail"].split()[1] for e in figures["events"] if e["kind"] in ("kill", "term")}
    assert killed <= {"relay", "inbox"} and killed, figures["events"]
    assert figures["environment"]["pubsub_client"] and figures["environment"]["pubsub_server"]
    assert figures["pubsub"]["subscription"].endswith("/subscriptions/sq-drill-inbox")
    assert "PASS: sent=40" in output and "published=" in output
    text = (drill.report / "report.md").read_text()
    assert text.startswith("# Queue fault drill: PASS (Pub/Sub: relay and inbox)")
    assert "| **left in Pub/Sub** (taken in by the closing pull) | **0** |" in text
    assert "--pubsub" in text and "--seed=11" in text and "--signal=mixed" in text
    logs = {p.name.split("-")[0] for p in (drill.report / "workers").iterdir()}
    assert logs == {"relay", "inbox"}
    assert not DrillEffect.objects.exists()
    assert not DrillEvent.objects.exists() and not DrillInbox.objects.exists()
    assert not DrillEventDead.objects.exists()


def test_a_copy_published_again_is_dropped_and_counted(
    drill: DrillRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy of an event already taken in, published again after the workers stopped, is
    dropped by the drill's closing pull and counted; the drill still passes."""
    after_workers = runner.PubSubDrill._after_workers

    def publish_a_copy(self: runner.PubSubDrill) -> None:
        seen = SeenEvent.objects.filter(inbox=DrillInbox._meta.label).first()
        assert seen is not None
        publisher = pubsub_v1.PublisherClient()
        publisher.publish(self.topic, b"{}", event_id=seen.event_id).result(timeout=30)
        after_workers(self)

    monkeypatch.setattr(runner.PubSubDrill, "_after_workers", publish_a_copy)
    figures, _ = drill("--messages", "3", "--workers", "1", "--kills", "0", *QUICK)
    assert figures["passed"] is True, figures
    assert figures["duplicates_dropped"] >= 1
    [closing] = [e for e in figures["events"] if e["kind"] == "pulled"]
    assert "0 taken in, 1 duplicates dropped" in closing["detail"]


def test_a_missing_and_a_doubled_effect_fail_the_pubsub_drill(
    drill: DrillRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = runner.PubSubDrill._count

    def tampered(self: runner.PubSubDrill) -> None:
        first, second = f"{self.run_id}-0000000", f"{self.run_id}-0000001"
        DrillEffect.objects.filter(run=self.run_id, key=first).delete()
        DrillEffect.objects.create(run=self.run_id, key=second, worker="tampered")
        count(self)

    monkeypatch.setattr(runner.PubSubDrill, "_count", tampered)
    with pytest.raises(CommandError, match="lost or handled twice"):
        drill("--messages", "3", "--workers", "1", "--kills", "0", *QUICK)
    figures = drill.figures()
    assert (figures["lost"], figures["twice"], figures["handled"]) == (1, 1, 2)
    assert (drill.report / "report.md").read_text().startswith("# Queue fault drill: FAIL")


def test_an_event_left_in_pubsub_fails_the_drill(
    drill: DrillRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event still on the subscription when the workers stopped is taken in by the closing
    pull: reported as left in Pub/Sub (and in the inbox queue), and the drill fails."""
    after_workers = runner.PubSubDrill._after_workers

    def publish_a_stray(self: runner.PubSubDrill) -> None:
        publisher = pubsub_v1.PublisherClient()
        stray = json.dumps({"run": "stray", "key": "stray-1"}).encode()
        publisher.publish(self.topic, stray, event_id=f"stray-{self.run_id}").result(timeout=30)
        after_workers(self)

    monkeypatch.setattr(runner.PubSubDrill, "_after_workers", publish_a_stray)
    with pytest.raises(CommandError, match="left in a queue, in Pub/Sub or dead-lettered"):
        drill("--messages", "2", "--workers", "1", "--kills", "0", *QUICK)
    figures = drill.figures()
    assert (figures["lost"], figures["twice"]) == (0, 0)
    assert figures["left_on_subscription"] == 1 and figures["left_in_queue"] == 1


def test_without_the_emulator_or_a_project_the_pubsub_drill_is_refused(
    settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("PUBSUB_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    settings.SPANNER_QUEUES_PUBSUB = {}
    with pytest.raises(CommandError, match=r"needs the Pub/Sub emulator .*PUBSUB_EMULATOR_HOST"):
        call_command("queuedrill", "--pubsub", "--report-dir", str(tmp_path), stdout=StringIO())
    assert not (tmp_path / "report.json").exists()
    assert not DrillEvent.objects.exists()


#: the ordered drill's load: streams, messages, seconds between outages (fewer messages and
#: outages on native queues: there the worker gives back a message received behind its key's
#: head, due 1 s later, then 2, 4 ... up to 30 s, in each of the two ordered queues; 24 messages
#: took 69 s to drain)
NATIVE = engine_for(DrillOrderedEvent).features.supports_native_queues
STREAMS, ORDERED_MESSAGES = 4, int(os.environ.get("SQ_DRILL_MESSAGES", 12 if NATIVE else 60))
OUTAGE_EVERY = "30" if NATIVE else "10"


@pytest.fixture
def outage(pubsub_emulator, monkeypatch: pytest.MonkeyPatch):
    """A Pub/Sub outage of 4 s under the workers (the emulator stopped, then continued), with
    the relay giving back what Pub/Sub has not confirmed within 1.5 s; the emulator is
    continued at the end whatever happened."""
    monkeypatch.setenv("SQ_PUBSUB_PUBLISH_TIMEOUT", "1.5")
    yield pubsub_emulator.outage_command(4.0)
    pubsub_emulator.resume()


def test_ordered_pubsub_drill_with_kills_and_a_pubsub_outage_keeps_each_streams_order(
    drill: DrillRun, outage: str
) -> None:
    """``queuedrill --pubsub --ordered``: streams of numbered events relayed with Pub/Sub
    ordering keys to an ordered inbox, relay and inbox workers SIGKILLed and Pub/Sub stopped
    under them; each stream ran at the inbox's receiver in send order, one at a time, each
    event once, and nothing was left anywhere."""
    figures, output = drill(
        *("--ordered", "--streams", str(STREAMS), "--messages", str(ORDERED_MESSAGES)),
        *("--workers", "1", "--concurrency", "2", "--kills", "2", "--lease", "2"),
        *("--work-ms", "5", "--seed", "17", *QUICK),
        *("--abort-method", "command", "--abort-command", outage, "--abort-every", OUTAGE_EVERY),
    )
    assert figures["mode"] == "pubsub" and figures["options"]["ordered"] is True
    assert figures["passed"] is True, figures
    assert figures["kills"] == 2 and figures["aborts"] >= 1, figures["events"]
    outages = [e for e in figures["events"] if e["kind"] == "abort"]
    assert all(e["detail"].endswith("exited with 0") for e in outages), outages
    assert (figures["sent"], figures["handled"]) == (ORDERED_MESSAGES, ORDERED_MESSAGES)
    assert (figures["lost"], figures["twice"], figures["order_violations"]) == (0, 0, [])
    assert (figures["left_in_queue"], figures["left_on_subscription"]) == (0, 0)
    assert figures["dead_lettered"] == 0
    assert figures["pubsub"]["subscription"].endswith("/subscriptions/sq-drill-ordered-inbox")
    assert "order_violations=0" in output
    text = (drill.report / "report.md").read_text()
    assert text.startswith("# Queue fault drill: PASS (Pub/Sub: relay and inbox)")
    assert "| **out of order** (a gap, an inversion or a double in a stream) | **0** |" in text
    assert "--pubsub" in text and "--ordered" in text and f"--streams={STREAMS}" in text
    assert not DrillOrderedEvent.objects.exists() and not DrillOrderedInbox.objects.exists()
    assert not DrillOrderedEventDead.objects.exists()


def test_an_ordered_pubsub_drill_counts_a_stream_run_out_of_order_and_fails(
    drill: DrillRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The order check is real through Pub/Sub too: an effect that says its stream had not
    reached the event before it fails the drill."""
    count = runner.OrderedPubSubDrill._count

    def tampered(self: runner.OrderedPubSubDrill) -> None:
        key = f"{self.run_id}-s000-0000002"
        DrillEffect.objects.filter(run=self.run_id, key=key).delete()
        DrillEffect.objects.create(run=self.run_id, key=key, worker="tampered", seq=2, after=0)
        count(self)

    monkeypatch.setattr(runner.OrderedPubSubDrill, "_count", tampered)
    with pytest.raises(CommandError, match="a stream ran out of order"):
        drill(
            *("--ordered", "--streams", "1", "--messages", "3", "--workers", "1"),
            *("--kills", "0", *QUICK),
        )
    figures = drill.figures()
    assert (figures["lost"], figures["twice"], figures["left_in_queue"]) == (0, 0, 0)
    assert figures["order_violations"] == [
        "s000: message 2 ran before the one before it (its stream had reached 0)"
    ]
    assert (drill.report / "report.md").read_text().startswith("# Queue fault drill: FAIL")

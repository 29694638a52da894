"""Replays (issue 39): the relay archives each event it published, with its ack, for
``ARCHIVE_DAYS``; ``pubsubreplay`` publishes a chosen range again with a replay id; an inbox
takes a replayed event in again only when it accepts that replay (``pubsubacceptreplay``), and
then once only, while ordinary redeliveries stay duplicates."""

from __future__ import annotations

import io
import json
import shlex
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from google.cloud import pubsub_v1

from spanner_queues import clock
from spanner_queues.contrib.pubsub import relay as relay_module
from spanner_queues.contrib.pubsub.inbox import InboxPuller
from spanner_queues.contrib.pubsub.models import RelayedEvent
from spanner_queues.testing import clock_is_movable, moved_clock
from spanner_queues.worker import Worker
from tests.conftest import wait_until
from tests.pubsubapp.models import BillingInbox, Charge, OrderEvents

pytestmark = pytest.mark.django_db(transaction=True)


def relay_burst() -> Any:
    return Worker(["pubsubapp.OrderEvents"], burst=True, install_signal_handlers=False).run()


def run_inbox() -> Any:
    return Worker(["pubsubapp.BillingInbox"], burst=True, install_signal_handlers=False).run()


def send_orders(*orders: int) -> None:
    for n in orders:
        OrderEvents.send(order=n, message_id=f"m{n}", payload={"pk": n})


def charges() -> list[int]:
    return sorted(Charge.objects.values_list("order_pk", flat=True))


def command(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def inbox(pubsub: Any) -> Any:
    subscriber = pubsub_v1.SubscriberClient()
    puller = InboxPuller(BillingInbox)

    def pull(taken_in: int, duplicates: int) -> None:
        """Pull until the puller's counters reach these, then run the inbox's receiver."""
        wait_until(
            lambda: (
                puller.pull_once(subscriber) >= 0
                and (puller.taken_in, puller.duplicates) >= (taken_in, duplicates)
            ),
            60,
        )
        assert (puller.taken_in, puller.duplicates) == (taken_in, duplicates)
        run_inbox()

    yield pull
    subscriber.close()


def test_a_published_event_is_archived_in_the_transaction_of_its_ack(pubsub) -> None:
    send_orders(1, 2)
    before = clock.now()
    assert relay_burst().processed == 2
    assert not OrderEvents.objects.exists()
    published = {m.attributes["event_id"]: m for m in pubsub.pull()}
    archived = {e.event_id: e for e in RelayedEvent.objects.all()}
    assert archived.keys() == published.keys()
    for eid, event in archived.items():
        message = published[eid]
        assert event.queue == message.attributes["queue"] == "pubsubapp.OrderEvents"
        assert event.key == message.attributes["key"]
        assert event.ordering_key == message.ordering_key
        assert bytes(event.data) == message.data
        assert event.published_at >= before


def test_nothing_is_archived_with_archive_days_0(pubsub, settings) -> None:
    settings.SPANNER_QUEUES_PUBSUB = {**settings.SPANNER_QUEUES_PUBSUB, "ARCHIVE_DAYS": 0}
    send_orders(1)
    assert relay_burst().processed == 1
    assert not OrderEvents.objects.exists()
    assert len(pubsub.pull()) == 1
    assert not RelayedEvent.objects.exists()


def test_an_event_whose_ack_rolls_back_is_not_archived(pubsub, monkeypatch) -> None:
    """The archive row and the ack commit together: a failing ack leaves no row."""
    send_orders(1)

    def failing_ack(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the ack failed")

    monkeypatch.setattr(relay_module.api, "ack_many", failing_ack)
    relay_burst()
    assert OrderEvents.objects.count() == 1  # not acked: it comes back
    assert not RelayedEvent.objects.exists()


def test_a_replayed_range_is_taken_in_again_exactly_once_and_nothing_else(pubsub, inbox) -> None:
    send_orders(1)
    relay_burst()
    since = clock.now()
    send_orders(2, 3)
    relay_burst()
    inbox(taken_in=3, duplicates=0)
    assert charges() == [1, 2, 3]

    # a replay the inbox does not accept: every copy a duplicate
    out = command("pubsubreplay", "pubsubapp.OrderEvents", "--event-id", "x", "--dry-run")
    assert "dry run: 0 event(s)" in out
    command("pubsubreplay", "pubsubapp.OrderEvents", "--since", since.isoformat(),
            "--replay-id", "not-accepted")  # fmt: skip
    inbox(taken_in=3, duplicates=2)
    assert charges() == [1, 2, 3]

    # accepted: the range (orders 2 and 3) is taken in again, order 1 is not republished
    command("pubsubacceptreplay", "pubsubapp.BillingInbox", "fix-1")
    out = command(
        "pubsubreplay", "pubsubapp.OrderEvents", "--since", since.isoformat(),
        "--replay-id", "fix-1", "--batch-size", "1",
    )  # fmt: skip
    assert "fix-1: 1/2 published" in out and "fix-1: done, 2 event(s) published" in out
    inbox(taken_in=5, duplicates=2)
    assert charges() == [1, 2, 2, 3, 3]

    # a second delivery of the same replay, and an ordinary redelivery: duplicates
    command("pubsubreplay", "pubsubapp.OrderEvents", "--key", '[2,"m2"]', "--replay-id", "fix-1")
    [first] = RelayedEvent.objects.filter(ordering_key="1")
    publisher = pubsub_v1.PublisherClient()
    publisher.publish(
        pubsub.topic, bytes(first.data), event_id=first.event_id, queue=first.queue, key=first.key
    ).result(30)
    inbox(taken_in=5, duplicates=4)
    assert charges() == [1, 2, 2, 3, 3]


def test_replay_chooses_by_time_key_and_event_id(pubsub) -> None:
    send_orders(1, 2)
    relay_burst()
    between = clock.now()
    send_orders(3)
    relay_burst()
    [two] = RelayedEvent.objects.filter(ordering_key="2").values_list("event_id", flat=True)

    def count(*args: str) -> int:
        out = command("pubsubreplay", "pubsubapp.OrderEvents", "--dry-run", *args)
        return int(out.split("dry run: ")[1].split(" ")[0])

    assert count("--since", between.isoformat()) == 1
    assert count("--until", between.isoformat()) == 2
    assert count("--key", '[2,"m2"]', "--key", '[3,"m3"]') == 2
    assert count("--ordering-key", "1", "--ordering-key", "3") == 2
    assert count("--event-id", two) == 1
    assert count("--event-id", two, "--ordering-key", "1") == 0


def test_the_dry_run_changes_nothing(pubsub) -> None:
    send_orders(1, 2)
    relay_burst()
    assert len(pubsub.pull()) == 2
    archived = sorted(RelayedEvent.objects.values_list("id", "published_at"))
    out = command("pubsubreplay", "pubsubapp.OrderEvents", "--ordering-key", "1", "--dry-run")
    assert out.strip() == (
        f"dry run: 1 event(s) of pubsubapp.OrderEvents would be replayed to {pubsub.topic}"
    )
    assert pubsub.pull() == []
    assert sorted(RelayedEvent.objects.values_list("id", "published_at")) == archived


def test_a_replay_needs_a_choice_of_events(pubsub) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="choose the events"):
        command("pubsubreplay", "pubsubapp.OrderEvents")


@pytest.mark.skipif(
    not clock_is_movable(), reason="native queues take time from Spanner's commit timestamps"
)
def test_the_archive_is_pruned_after_its_window(pubsub, settings, monkeypatch) -> None:
    settings.SPANNER_QUEUES_PUBSUB = {**settings.SPANNER_QUEUES_PUBSUB, "ARCHIVE_DAYS": 2}
    monkeypatch.setattr(relay_module, "ARCHIVE_PRUNE_EVERY_SECONDS", 0.0)
    monkeypatch.setattr(relay_module, "_prunes", clock.Throttle())
    with moved_clock() as moved:
        send_orders(1)
        relay_burst()
        moved.advance(timedelta(days=1, hours=23))
        send_orders(2)
        relay_burst()  # prunes: order 1's event is still within the window
        assert sorted(RelayedEvent.objects.values_list("ordering_key", flat=True)) == ["1", "2"]
        moved.advance(timedelta(hours=2))
        send_orders(3)
        relay_burst()  # prunes order 1's event, 2 days and 1 hour old
        assert sorted(RelayedEvent.objects.values_list("ordering_key", flat=True)) == ["2", "3"]
    assert json.loads(bytes(RelayedEvent.objects.get(ordering_key="3").data)) == {"pk": 3}


def test_the_howto_replay_commands_run_as_shown(pubsub) -> None:
    """The commands of docs/howto/pubsub.md's replay section, on the test app's queues."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "howto" / "pubsub.md").read_text()
    section = page.split("## Replay: send a range again on purpose")[1].split("\n## ")[0]
    block = section.split("```bash\n")[1].split("```")[0]
    lines = [line for line in block.splitlines() if line.startswith("python manage.py ")]
    assert len(lines) == 3
    send_orders(1, 2)
    relay_burst()
    assert len(pubsub.pull()) == 2
    RelayedEvent.objects.update(published_at=datetime(2026, 12, 1, 8, 30, tzinfo=UTC))
    renamed = {"billing.BillingInbox": "pubsubapp.BillingInbox"}
    renamed["shop.OrderEvents"] = "pubsubapp.OrderEvents"
    outputs = []
    for line in lines:
        args = [renamed.get(a, a) for a in shlex.split(line)[2:]]
        outputs.append(command(*args))
    assert outputs[0] == "pubsubapp.BillingInbox takes in replay fix-1042 once\n"
    assert outputs[1].startswith("dry run: 2 event(s) of pubsubapp.OrderEvents")
    assert outputs[2].endswith("replay fix-1042: done, 2 event(s) published\n")
    replayed = wait_until(lambda: pubsub.pull(), 30)
    assert {m.attributes["replay_id"] for m in replayed} == {"fix-1042"}

"""Failures grouped by cause (issue 40): each failed run is counted under its queue, its error's
class and a fingerprint of its text in which numbers, ids and addresses are folded, with the
messages given up because of it; on every engine, whatever happens to the count."""

from __future__ import annotations

import dataclasses
import logging
import re
from datetime import timedelta
from typing import Any

import pytest

import spanner_queues.worker as sq_worker
import spanner_queues.worker.apply as sq_apply
from spanner_queues import causes
from spanner_queues.engines import engine_for
from spanner_queues.receivers import ReceiverRegistry, receiver
from spanner_queues.worker import Worker
from tests.workerapp.models import WorkItems, WorkItemsDead

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("text", "folded"),
    [
        ("connect to carrier 10.0.0.7:443 after 3012 ms", "connect to carrier <ip> after <n> ms"),
        ("order 1234 not found", "order <n> not found"),
        ("'3f2b8c1e-9d4a-4c1b-8e2f-1a2b3c4d5e6f'", "'<uuid>'"),
        ("digest 9f86d081884c7d659a2feaa0c55ad015 bad", "digest <hex> bad"),
        ("object at 0x7f3a2b1c", "object at <hex>"),
        ("user bob@example.com refused", "user <email> refused"),
        (
            "GET https://api.example.com/v1/orders/991?x=1: 503",
            "GET https://api.example.com/<path> <n>",
        ),
        ("[2001:db8::1]:8080 and fe80::1 down", "<ip> and <ip> down"),
        ("job_12  failed\n twice", "job_<n> failed twice"),
        ("HTTP2 and utf8 stay", "HTTP2 and utf8 stay"),
    ],
)
def test_fingerprints_fold_what_differs_from_one_message_to_the_next(
    text: str, folded: str
) -> None:
    assert causes.fingerprint(text) == folded


def test_fingerprints_are_cut_and_ids_are_stable() -> None:
    assert len(causes.fingerprint("x" * 5000)) == causes.FINGERPRINT_LIMIT
    assert causes.error_class(TimeoutError()) == "TimeoutError"
    assert causes.error_class(causes.FailureCause.DoesNotExist()) == (
        "spanner_queues.causes.FailureCause.DoesNotExist"
    )
    one = causes.cause_id("q", "TimeoutError", "connect <n>")
    assert one == causes.cause_id("q", "TimeoutError", "connect <n>")
    assert one != causes.cause_id("q", "ValueError", "connect <n>")
    assert one != causes.cause_id("other", "TimeoutError", "connect <n>")


class CarrierTimeout(TimeoutError):
    pass


def _give_up_at_the_first_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """WorkItems with ``max_attempts = 1``: each failing message is dead-lettered at its first
    failure (no wait for a redelivery on any engine)."""
    for module in (sq_worker, sq_apply):
        real = module.queue_options
        monkeypatch.setattr(
            module,
            "queue_options",
            lambda m, real=real: (
                dataclasses.replace(real(m), max_attempts=1) if m is WorkItems else real(m)
            ),
        )


def _failing_registry() -> ReceiverRegistry:
    registry = ReceiverRegistry()

    @receiver(WorkItems, registry=registry)
    def fail(message: Any) -> None:
        n = int(message.json()["n"])
        kind = message.json()["kind"]
        if kind == "timeout":
            raise CarrierTimeout(f"connect to carrier 10.0.{n}.7:443 after {3000 + n} ms")
        if kind == "missing":
            raise LookupError(f"order {1000 + n} not found")
        raise ValueError(f"bad address for customer {n}@example.com")

    return registry


def _run(registry: ReceiverRegistry) -> None:
    Worker([WorkItems], registry=registry, burst=True, install_signal_handlers=False).run()


def test_three_causes_are_three_groups_with_their_failures_and_the_messages_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _give_up_at_the_first_failure(monkeypatch)
    kinds = {"timeout": 4, "missing": 3, "address": 2}
    WorkItems.send_many(
        [{"payload": {"kind": kind, "n": n}} for kind, count in kinds.items() for n in range(count)]
    )
    _run(_failing_registry())
    assert WorkItemsDead.objects.count() == 9 and not WorkItems.objects.exists()
    db = engine_for(WorkItems).database
    found = {c.title: c for c in causes.causes_of("workerapp.WorkItems", using=db)}
    assert set(found) == {
        "CarrierTimeout: connect to carrier <ip> after <n> ms",
        "LookupError: order <n> not found",
        "ValueError: bad address for customer <email>",
    }
    timeout = found["CarrierTimeout: connect to carrier <ip> after <n> ms"]
    assert (timeout.failures, timeout.given_up) == (4, 4)
    assert timeout.error_class == f"{__name__}.CarrierTimeout"
    # the first failure's own text (native queues deliver in no set order)
    assert re.fullmatch(
        r"CarrierTimeout: connect to carrier 10\.0\.\d\.7:443 after 300\d ms", timeout.sample
    )
    assert timeout.first_at <= timeout.last_at
    assert (
        found["LookupError: order <n> not found"].failures,
        found["LookupError: order <n> not found"].given_up,
    ) == (3, 3)
    address = found["ValueError: bad address for customer <email>"]
    assert (address.failures, address.given_up) == (2, 2)


def test_a_cause_that_cannot_be_counted_changes_nothing_of_the_delivery(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _give_up_at_the_first_failure(monkeypatch)

    def broken(*args: Any) -> None:
        raise RuntimeError("the causes table is gone")

    monkeypatch.setattr(causes, "_count", broken)
    WorkItems.send(payload={"kind": "missing", "n": 1})
    with caplog.at_level(logging.WARNING, logger="spanner_queues.worker"):
        _run(_failing_registry())
    assert WorkItemsDead.objects.count() == 1 and not WorkItems.objects.exists()
    assert "counting a failure's cause failed" in caplog.text
    assert not causes.FailureCause.objects.exists()


def test_a_queue_keeps_at_most_its_limit_of_causes_and_counts_the_rest_under_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(causes, "MAX_CAUSES_PER_QUEUE", 2)
    db = engine_for(WorkItems).database
    for text in ("first", "second", "third", "fourth"):
        causes.note("workerapp.WorkItems", ValueError(text), using=db)
    causes.note("workerapp.WorkItems", ValueError("first"), using=db)
    found = {c.fingerprint: c.failures for c in causes.causes_of("workerapp.WorkItems", using=db)}
    assert found == {"first": 2, "second": 1, causes.OTHER: 2}


def test_causes_not_seen_for_a_week_are_pruned(monkeypatch: pytest.MonkeyPatch) -> None:
    db = engine_for(WorkItems).database
    causes.note("workerapp.WorkItems", ValueError("old"), using=db)
    later = causes.clock.now() + timedelta(days=causes.KEEP_DAYS, minutes=1)
    causes.note("workerapp.WorkItems", ValueError("new"), using=db)
    monkeypatch.setattr(causes.clock, "now", lambda: later)
    causes.FailureCause.objects.using(db).filter(fingerprint="new").update(last_at=later)
    assert causes.prune(using=db) == 1
    assert [c.fingerprint for c in causes.causes_of("workerapp.WorkItems", using=db)] == ["new"]

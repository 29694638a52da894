"""Filtered bulk actions: every matching message, in bounded transactions, each once; a message
leased or acked since it was read is skipped and counted; GET changes nothing; permissions."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from spanner_queues import api, clock
from spanner_queues.admin import bulk
from spanner_queues.admin.bulk import MessageFilter, apply_page, read_page, run_bulk
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import InvalidArgument
from spanner_queues.keys import row_to_message
from spanner_queues.storage import rows
from tests.admin.conftest import queue_url
from tests.testapp.models import Emails, EmailsDead, Jobs

pytestmark = pytest.mark.django_db(transaction=True)

BULK_URL = queue_url("testapp.EmailsDead") + "bulk/"


def _native() -> bool:
    return engine_for(EmailsDead).features.supports_native_queues


def _size() -> int:
    """The set's size: ``SQ_BULK_MESSAGES`` (the benchmark's 20,000), else small; the emulator
    runs one transaction at a time, so native queues get a few dozen."""
    if os.environ.get("SQ_BULK_MESSAGES"):
        return int(os.environ["SQ_BULK_MESSAGES"])
    return 24 if _native() else 450


def _dead_lettered(n: int, prefix: str, text: str) -> list[tuple[Any, ...]]:
    sent: list[tuple[Any, ...]] = []
    for start in range(0, n, 500):
        batch = [
            {"id": f"{prefix}{i:06d}", "payload": {"error": text, "n": i}}
            for i in range(start, min(n, start + 500))
        ]
        sent += [m.key for m in api.send_many(EmailsDead, batch)]
    return sent


def _keys(model: Any) -> set[str]:
    return {k for (k,) in rows(model, engine_for(model).database).values_list("pk")}


def test_bulk_replay_of_dead_lettered_messages_moves_each_match_once_in_bounded_transactions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    n = _size()
    batch = 10 if _native() else 100
    matching = set(k for (k,) in _dead_lettered(n, "t1-", "carrier timeout"))
    others = set(k for (k,) in _dead_lettered(6, "t2-", "carrier timeout"))
    others |= set(k for (k,) in _dead_lettered(6, "t1-x", "bad address"))  # prefix, not text
    transactions: list[int] = []
    real_apply = bulk.apply_page

    def counted(model: Any, messages: list[Any], *args: Any, **kwargs: Any) -> tuple[int, int]:
        transactions.append(len(messages))
        return real_apply(model, messages, *args, **kwargs)

    monkeypatch.setattr(bulk, "apply_page", counted)
    flt = MessageFilter.from_params(
        EmailsDead, {"prefix.id": "t1-", "text": "carrier timeout", "state": "dead_lettered"}
    )
    assert bulk.count(EmailsDead, flt) == n
    started = time.perf_counter()
    result = run_bulk(EmailsDead, flt, "move", to=Emails, batch_size=batch)
    seconds = time.perf_counter() - started
    if os.environ.get("SQ_BULK_MESSAGES"):
        print(f"\nbulk move of {n}: {seconds:.1f} s, {n / seconds:.0f} messages/s")
    assert (result.done, result.skipped, result.finished, result.error) == (n, 0, True, "")
    assert result.batches == len([t for t in transactions if t]) == -(-n // batch)
    assert max(transactions) <= batch
    assert _keys(Emails) == matching  # each once: a second copy would fail on its key
    assert _keys(EmailsDead) == others
    moved = rows(Emails, engine_for(Emails).database).first()
    assert moved is not None and row_to_message(Emails, moved).json()["error"] == (
        "carrier timeout"
    )


@pytest.mark.requires("stores_bookkeeping_fields")  # leases are columns of the row
def test_a_message_leased_between_its_read_and_its_batch_is_skipped_and_kept() -> None:
    sent = api.send_many(Jobs, [{"payload": {"n": i}} for i in range(3)])
    page = read_page(Jobs, MessageFilter(), None, 10)
    assert len(page.messages) == 3
    leased = api.receive(Jobs, max_messages=1)
    assert len(leased) == 1
    assert apply_page(Jobs, page.messages, "retry") == (2, 1)
    held = Jobs.objects.get(pk=leased[0].key[0])
    assert held.lease_token == leased[0].lease_token  # its lease stands: the receiver can ack
    api.ack(leased[0])
    assert len(sent) == 3


def test_a_message_acked_between_its_read_and_its_batch_is_skipped_not_sent_again() -> None:
    sent = api.send_many(Jobs, [{"payload": {"n": i}} for i in range(3)])
    page = read_page(Jobs, MessageFilter(), None, 10)
    api.ack(sent[0])
    assert apply_page(Jobs, page.messages, "delete") == (2, 1)
    assert _keys(Jobs) == set()


def test_filter_by_key_payload_and_deliver_time_range() -> None:
    now = clock.now()
    api.send_many(
        Jobs,
        [
            {"id": "a1", "payload": {"k": "x"}},
            {"id": "a2", "payload": {"k": "y"}, "deliver_time": now + timedelta(hours=1)},
            {"id": "b1", "payload": {"k": "x"}, "deliver_time": now + timedelta(hours=3)},
        ],
    )
    early = (now + timedelta(hours=2)).isoformat()

    def matched(**params: str) -> list[str]:
        flt = MessageFilter.from_params(Jobs, params)
        return sorted(m.key[0] for p in bulk.pages(Jobs, flt, 2) for m in p.messages)

    assert matched(**{"prefix.id": "a"}) == ["a1", "a2"]
    assert matched(**{"key.id": "b1"}) == ["b1"]
    assert matched(text='"k":"x"') == ["a1", "b1"]
    assert matched(before=early) == ["a1", "a2"]
    assert matched(after=early, text="x") == ["b1"]
    assert matched(state="scheduled") == ["a2", "b1"]
    assert matched(state="ready") == ["a1"]
    with pytest.raises(InvalidArgument, match="limited to 200"):
        MessageFilter.from_params(Jobs, {"text": "x" * 201})
    with pytest.raises(InvalidArgument, match="no queue's dead-letter queue"):
        MessageFilter.from_params(Jobs, {"state": "dead_lettered"})


def test_a_get_of_the_bulk_page_changes_nothing(operator_client: Client) -> None:
    _dead_lettered(3, "g-", "x")
    response = operator_client.get(BULK_URL, {"operation": "delete", "post": "yes"})
    assert response.status_code == 302
    assert len(_keys(EmailsDead)) == 3


def test_a_user_without_the_permission_is_refused(
    make_user: Callable[..., Any], login: Callable[[Any], Client]
) -> None:
    _dead_lettered(3, "p-", "x")
    client = login(make_user("view_queues", "reschedule_message"))  # not ack_message
    response = client.post(BULK_URL, {"operation": "delete", "post": "yes"})
    assert response.status_code == 403
    assert len(_keys(EmailsDead)) == 3
    response = client.post(BULK_URL, {"operation": "retry"})
    assert response.status_code == 200  # its own permission: the confirmation


def test_admin_bulk_action_previews_confirms_runs_in_parts_and_logs_each(
    operator_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("spanner_queues.admin.views.BULK_PER_REQUEST", 5)
    _dead_lettered(8, "a-", "carrier timeout")
    _dead_lettered(2, "b-", "carrier timeout")
    form = {"operation": "move", "prefix.id": "a-", "text": "timeout"}
    confirm = operator_client.post(BULK_URL, form)
    assert confirm.status_code == 200
    assert confirm.context["matching"] == 8
    assert len(_keys(EmailsDead)) == 10  # the confirmation changes nothing
    part = operator_client.post(BULK_URL, {**form, "post": "yes", "to": "testapp.emails"})
    assert part.status_code == 200  # 5 of 8: the progress page carries the cursor
    assert (part.context["done"], part.context["skipped"]) == (5, 0)
    assert len(_keys(Emails)) == 5
    fields = {"cursor": part.context["cursor"], "done": "5", "skipped": "0"}
    last = operator_client.post(BULK_URL, {**form, **fields, "post": "yes", "to": "testapp.emails"})
    assert last.status_code == 302
    assert _keys(Emails) == {f"a-{i:06d}" for i in range(8)}
    assert _keys(EmailsDead) == {"b-000000", "b-000001"}
    entries = sorted(LogEntry.objects.values_list("change_message", flat=True))  # (ids: any order)
    assert len(entries) == 2
    prefix = "Bulk move to testapp.Emails on id starts with 'a-', payload contains 'timeout': "
    assert entries == [
        prefix + f"{n} done, 0 skipped (leased or changed since read), in 1 transaction(s)."
        for n in (3, 5)
    ]


def test_queuemessages_dry_run_counts_and_changes_nothing_then_moves_to_the_source() -> None:
    _dead_lettered(4, "c-", "carrier timeout")
    _dead_lettered(1, "d-", "other")
    out = StringIO()
    call_command(
        "queuemessages",
        "testapp.EmailsDead",
        "--text",
        "carrier",
        "--move-to",
        "--dry-run",
        stdout=out,
    )
    assert "4 message(s) match payload contains 'carrier'" in out.getvalue()
    assert "Dry run: would move to testapp.Emails 4 message(s)." in out.getvalue()
    assert len(_keys(EmailsDead)) == 5
    out = StringIO()
    call_command(
        "queuemessages",
        "testapp.EmailsDead",
        "--text",
        "carrier",
        "--move-to",
        "--batch-size",
        "3",
        stdout=out,
    )
    assert "batch 2: 4 done, 0 skipped" in out.getvalue()
    assert _keys(Emails) == {f"c-{i:06d}" for i in range(4)}
    assert _keys(EmailsDead) == {"d-000000"}


@pytest.mark.requires("stores_bookkeeping_fields")  # attempts are a column of the row
def test_failing_and_attempt_filters_read_the_attempts_column() -> None:
    api.send_many(Jobs, [{"id": i, "payload": {}} for i in ("fresh", "tried")])
    tried = api.receive(Jobs, max_messages=2)
    held = next(m for m in tried if m.key == ("tried",))
    api.release(held)  # one attempt, not leased
    for m in tried:
        if m.key == ("fresh",):
            api.release(m)
    flt = MessageFilter.from_params(Jobs, {"state": "failing"})
    assert bulk.count(Jobs, flt) == 2  # both were delivered once
    assert bulk.count(Jobs, MessageFilter.from_params(Jobs, {"min_attempts": "2"})) == 0
    assert bulk.count(Jobs, MessageFilter.from_params(Jobs, {"max_attempts": "1"})) == 2


def test_a_failing_batch_stops_the_run_keeps_the_batches_before_and_is_logged(
    django_user_model: Any,
) -> None:
    user = django_user_model.objects.create_user("op", password="pw", is_staff=True)
    _dead_lettered(3, "f-", "x")
    Emails.send(id="f-000001", payload={"already": "there"})  # the second batch's key
    result = run_bulk(EmailsDead, MessageFilter(), "move", to=Emails, batch_size=1, user_id=user.pk)
    assert (result.done, result.batches, result.finished) == (1, 1, False)
    assert result.error
    assert _keys(Emails) == {"f-000000", "f-000001"}
    assert _keys(EmailsDead) == {"f-000001", "f-000002"}  # the failed batch changed nothing
    (entry,) = LogEntry.objects.values_list("change_message", flat=True)
    assert "1 done, 0 skipped" in entry and "; stopped: " in entry


def test_admin_delay_carries_its_time_to_every_part(
    operator_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("spanner_queues.admin.views.BULK_PER_REQUEST", 2)
    api.send_many(Jobs, [{"id": f"j{i}", "payload": {}} for i in range(3)])
    url = queue_url("testapp.Jobs") + "bulk/"
    when = (clock.now() + timedelta(hours=5)).replace(microsecond=0)
    local = timezone.localtime(when).strftime("%Y-%m-%dT%H:%M:%S")
    form = {"operation": "delay", "post": "yes", "deliver_time": local}
    part = operator_client.post(url, form)
    assert part.status_code == 200 and part.context["done"] == 2
    last = operator_client.post(url, {**form, "cursor": part.context["cursor"]})
    assert last.status_code == 302
    assert {m.deliver_time for m in Jobs.objects.all()} == {when}

"""Conformance: sending is transactional, keys are identity, payloads are validated first."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from spanner_queues import api
from spanner_queues.exceptions import (
    InvalidMessage,
    MessageAlreadyExists,
    PayloadError,
    PayloadTooLarge,
    QueueError,
    UnknownQueue,
)
from spanner_queues.testing.conformance.models import Account, Jobs, UserTasks
from spanner_queues.testing.conformance.support import receive_due

pytestmark = pytest.mark.django_db(transaction=True)


def test_rollback_leaves_no_message() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Account.objects.create(name="ada")
        UserTasks.send(user_id=1, message_id="welcome", payload={"type": "welcome"})
        raise RuntimeError("boom")
    assert not Account.objects.exists()
    assert not UserTasks.objects.exists()
    assert api.receive(UserTasks) == []


def test_commit_makes_message_receivable() -> None:
    with transaction.atomic():
        account = Account.objects.create(name="ada")
        sent = UserTasks.send(user_id=account.pk, message_id="welcome", payload={"type": "w"})
    assert sent.key == (account.pk, "welcome")
    [message] = receive_due(UserTasks)
    assert message.key == (account.pk, "welcome")
    assert message.key_dict == {"user_id": account.pk, "message_id": "welcome"}
    assert message.json() == {"type": "w"}
    assert message.attempt == 1
    assert message.lease_token
    assert message.lease_expires_at > timezone.now()


def test_payload_kinds_are_stored_as_bytes() -> None:
    UserTasks.send_many(
        [
            {"user_id": 1, "message_id": "b", "payload": b"\x00\xffraw"},
            {"user_id": 1, "message_id": "s", "payload": "héllo"},
            {"user_id": 1, "message_id": "j", "payload": {"n": [1, 2], "s": "é"}},
        ]
    )
    got = {m.key[1]: m for m in receive_due(UserTasks, 3, max_messages=10)}
    assert got["b"].payload == b"\x00\xffraw"
    assert got["s"].text() == "héllo"
    assert got["j"].json() == {"n": [1, 2], "s": "é"}
    assert bytes(UserTasks.objects.get(pk=(1, "j")).payload) == '{"n":[1,2],"s":"é"}'.encode()


def test_malformed_payload_writes_nothing_and_says_why() -> None:
    with pytest.raises(PayloadError, match="not bytes, str or JSON-serialisable"):
        with transaction.atomic():
            Account.objects.create(name="x")
            UserTasks.send(user_id=1, message_id="ok", payload={"when": object()})
    assert not Account.objects.exists()
    assert not UserTasks.objects.exists()


def test_send_many_is_all_or_nothing_on_bad_input() -> None:
    with pytest.raises(PayloadError):
        UserTasks.send_many(
            [
                {"user_id": 1, "message_id": "a", "payload": "fine"},
                {"user_id": 1, "message_id": "b", "payload": {1, 2}},
            ]
        )
    assert not UserTasks.objects.exists()


def test_payload_limit() -> None:
    with pytest.raises(PayloadTooLarge, match="4096"):
        UserTasks.send(user_id=1, message_id="big", payload=b"x" * 5000)
    assert isinstance(PayloadTooLarge("x"), QueueError)


def test_duplicate_key_fails_cleanly() -> None:
    UserTasks.send(user_id=1, message_id="once", payload="first")
    with pytest.raises(MessageAlreadyExists, match="already exists"):
        with transaction.atomic():
            Account.objects.create(name="kept?")
            UserTasks.send(user_id=1, message_id="once", payload="second")
    assert not Account.objects.exists()
    assert [bytes(p) for p in UserTasks.objects.values_list("payload", flat=True)] == [b"first"]


def test_single_column_key_with_default() -> None:
    a = Jobs.send(payload="a")
    b = Jobs.send(payload="b")
    assert a.key != b.key and len(a.key[0]) == 32
    assert Jobs.objects.count() == 2


def test_bad_keys_and_times_are_rejected() -> None:
    with pytest.raises(InvalidMessage, match="missing"):
        UserTasks.send(user_id=1, payload="x")
    with pytest.raises(InvalidMessage, match="not a key field"):
        UserTasks.send(user_id=1, message_id="a", colour="red")
    with pytest.raises(InvalidMessage, match="timezone-aware"):
        UserTasks.send(user_id=1, message_id="a", deliver_time=timezone.now().replace(tzinfo=None))
    with pytest.raises(InvalidMessage, match="not both"):
        UserTasks.send(user_id=1, message_id="a", delay=timedelta(1), deliver_time=timezone.now())
    assert not UserTasks.objects.exists()


def test_unknown_queue_is_a_clear_error() -> None:
    with pytest.raises(UnknownQueue, match="No queue named 'nope'"):
        api.send("nope", payload="x")
    assert (
        api.send("spanner_queues_conformance.jobs", payload="x").queue
        == "spanner_queues_conformance.Jobs"
    )
    assert api.send("spanner_queues_conformance_usertasks", user_id=1, message_id="t", payload="x")


def test_past_deliver_time_means_now() -> None:
    before = timezone.now()
    sent = UserTasks.send(user_id=1, message_id="p", deliver_time=before - timedelta(days=3))
    assert sent.deliver_time is not None and sent.deliver_time >= before
    assert len(receive_due(UserTasks)) == 1


def test_replace_swaps_the_message_under_one_key() -> None:
    UserTasks.send(user_id=7, message_id="hb", payload="1", delay=timedelta(seconds=60))
    UserTasks.replace(user_id=7, message_id="hb", payload="2", delay=timedelta(seconds=60))
    UserTasks.replace(user_id=7, message_id="fresh", payload="3")  # no previous message: fine
    rows = {r.message_id: bytes(r.payload) for r in UserTasks.objects.all()}
    assert rows == {"hb": b"2", "fresh": b"3"}


@pytest.mark.requires("stores_bookkeeping_fields")  # the engine writes the row (native: Spanner)
@pytest.mark.parametrize("count", [1, 2])  # one message (a prepared INSERT) and a batch
def test_sent_messages_are_what_was_stored(count: int) -> None:
    """``send``/``send_many`` return each message as its row holds it: key, payload bytes,
    deliver time (now, or the later time asked for), send time, never delivered."""
    later = timezone.now() + timedelta(hours=1)
    specs = [
        {"user_id": 7, "message_id": f"m{n}", "payload": {"n": n}, "deliver_time": later}
        for n in range(count)
    ]
    specs[0].pop("deliver_time")
    before = timezone.now()
    with transaction.atomic():
        sent = UserTasks.send_many(specs)
    assert [m.key for m in sent] == [(7, f"m{n}") for n in range(count)]
    for message in sent:
        row = UserTasks.objects.get(user_id=7, message_id=message.key[1])
        assert message.queue == UserTasks._meta.label
        assert message.key_names == ("user_id", "message_id")
        assert message.payload == bytes(row.payload) == f'{{"n":{message.key[1][1:]}}}'.encode()
        assert message.deliver_time == row.deliver_time
        assert message.send_time == row.send_time
        assert message.attempt == row.attempts == 0 and message.lease_token is None
    first = sent[0].deliver_time
    assert first is not None and before <= first <= timezone.now()
    assert all(m.deliver_time == later for m in sent[1:])


def test_send_with_a_key_of_the_wrong_type_raises_invalid_message() -> None:
    """guarantees.md: "a malformed key ... raise(s) InvalidMessage ... and write nothing": a
    non-numeric value for a BigIntegerField key is an ``InvalidMessage``, not the ORM's raw
    ValueError."""
    with pytest.raises(InvalidMessage):
        UserTasks.send(user_id="not-a-number", message_id="welcome")


def test_send_with_a_null_key_raises_a_queue_error() -> None:
    """A key value given as None is a ``QueueError`` (not the database's raw IntegrityError,
    "NOT NULL constraint failed")."""
    with pytest.raises(QueueError):
        with transaction.atomic():
            UserTasks.send(user_id=None, message_id="welcome")


def test_message_already_exists_names_the_key_that_exists_not_the_first_of_the_batch() -> None:
    UserTasks.send(user_id=7, message_id="m24", payload="there")
    batch = [{"user_id": 7, "message_id": f"m{i}", "payload": "x"} for i in range(30)]
    with pytest.raises(MessageAlreadyExists) as raised:
        with transaction.atomic():
            api.send_many(UserTasks, batch)
    text = str(raised.value)
    assert "m24" in text
    assert "'m0'" not in text and "'m1'" not in text
    assert UserTasks.objects.count() == 1

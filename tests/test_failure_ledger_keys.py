"""The failure ledger's key text (``failures.key_text``): one text per key, so keys that
differ only in microseconds never share a failure record, while the texts of keys the
earlier encoding kept exactly (whole milliseconds) are unchanged."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from spanner_queues import clock
from spanner_queues.failures import Seen, failures_of, key_text, record_failure
from spanner_queues.message import Message

AT = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
SAME_MILLISECOND = AT.replace(microsecond=123000)


def test_keys_that_differ_in_microseconds_have_different_texts() -> None:
    assert key_text((AT,)) != key_text((SAME_MILLISECOND,))
    assert key_text((AT, "job")) != key_text((AT + timedelta(microseconds=1), "job"))
    assert key_text((AT,)) == '["2026-01-02T03:04:05.123456Z"]'


def test_texts_of_keys_with_whole_milliseconds_are_unchanged() -> None:
    """Records written before keep meaning their keys: Django's JSON, as before."""
    for key in [(SAME_MILLISECOND, 7), (AT.replace(microsecond=0),), ("a", 1.5)]:
        assert key_text(key) == json.dumps(list(key), cls=DjangoJSONEncoder, separators=(",", ":"))
    assert key_text((SAME_MILLISECOND, 7)) == '["2026-01-02T03:04:05.123Z",7]'


def test_a_key_text_reads_back_as_its_key() -> None:
    """The prune parses each record's text back into a key (``to_python``) and keeps only
    records whose text it gives again: a microsecond key must survive the round trip."""
    field = models.DateTimeField()
    for at in (AT, SAME_MILLISECOND, AT.replace(microsecond=0)):
        [value] = json.loads(key_text((at,)))
        assert field.to_python(value) == at
        assert key_text((field.to_python(value),)) == key_text((at,))


def _message(at: datetime) -> Message:
    now = clock.now()
    return Message(
        queue="testapp.Stamped",
        key=(at,),
        key_names=("at",),
        payload=b"x",
        deliver_time=now - timedelta(seconds=1),
        attempt=1,
        lease_token="t",
        lease_expires_at=now + timedelta(seconds=10),
    )


@pytest.mark.django_db
def test_a_failure_of_one_key_is_not_counted_for_a_key_a_microsecond_apart() -> None:
    record_failure(_message(AT), RuntimeError("no"), using="default")
    record_failure(_message(AT), RuntimeError("no"), using="default")
    assert record_failure(_message(SAME_MILLISECOND), RuntimeError("no"), using="default") == 1
    due = {k: Seen(None) for k in [(AT,), (SAME_MILLISECOND,), (AT + timedelta(microseconds=1),)]}
    assert failures_of("testapp.Stamped", due, using="default") == {
        (AT,): 2,
        (SAME_MILLISECOND,): 1,
    }

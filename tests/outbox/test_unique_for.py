"""``outbox.register(..., unique_for=)``: a model's saves send a key at most once per window,
in the save's transaction."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction

from spanner_queues import api, outbox
from spanner_queues.exceptions import InvalidArgument
from spanner_queues.uniqueness import SentKey
from tests.outboxapp.models import ModelEvents, Note

pytestmark = pytest.mark.django_db(transaction=True)


def _key(note: Note, *, event: str, changed: frozenset[str]) -> dict[str, Any]:
    return {"object_id": note.pk, "message_id": "changed"}


def test_saves_within_the_window_send_once_even_after_the_first_was_acked(
    registered: Any,
) -> None:
    registered(Note, queue=ModelEvents, key=_key, unique_for=timedelta(hours=1))
    with transaction.atomic():
        note = Note.objects.create(text="a")
        note.text = "b"
        note.save()  # the same key in the same transaction: dropped
    [row] = ModelEvents.objects.all()
    api.ack(row.as_message())
    with transaction.atomic():
        note.text = "c"
        note.save()
    assert not ModelEvents.objects.exists()
    with transaction.atomic():
        other = Note.objects.create(text="other")
    assert list(ModelEvents.objects.values_list("object_id", flat=True)) == [other.pk]


def test_a_rolled_back_save_leaves_no_ledger_row(registered: Any) -> None:
    registered(Note, queue=ModelEvents, key=_key, unique_for=timedelta(hours=1))
    with pytest.raises(RuntimeError), transaction.atomic():
        Note.objects.create(text="a")
        raise RuntimeError("boom")
    assert not SentKey.objects.exists()


def test_send_for_drops_within_the_window(registered: Any) -> None:
    registered(Note, queue=ModelEvents, key=_key, unique_for=timedelta(hours=1))
    with transaction.atomic():
        note = Note.objects.create(text="a")
    with transaction.atomic():
        [again] = outbox.send_for([note], event="updated")
    assert again.dropped is True and ModelEvents.objects.count() == 1


def test_unique_for_must_be_a_positive_timedelta() -> None:
    with pytest.raises(InvalidArgument, match="positive timedelta"):
        outbox.register(Note, queue=ModelEvents, unique_for=timedelta(0))
    assert outbox.registrations(Note) == []

"""Registration: forms, options, builders and the errors for configurations that cannot work."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import transaction

from spanner_queues import outbox
from spanner_queues.exceptions import InvalidMessage, QueueConfigurationError, QueueError
from tests.outbox.conftest import payloads
from tests.outboxapp.models import (
    Author,
    AuthorTasks,
    Book,
    Comment,
    CommentJobs,
    ModelEvents,
    Note,
    ProxyAuthor,
    UserEvents,
)


def test_registrations_made_in_app_ready_and_by_decorator() -> None:
    assert {r.queue_label for r in outbox.registrations(Author)} == {
        "outboxapp.ModelEvents",
        "outboxapp.AuthorTasks",
    }
    assert outbox.registrations(ProxyAuthor) == outbox.registrations(Author)
    [comment] = outbox.registrations(Comment)
    assert comment.on == {"created"} and comment.queue_model() is CommentJobs
    assert "outboxapp.Book -> outboxapp.ModelEvents" in repr(outbox.registrations(Book)[0])


@pytest.mark.django_db(transaction=True)
def test_decorator_form_and_single_column_key_default() -> None:
    with transaction.atomic():
        comment = Comment.objects.create(text="hi")
    [job] = CommentJobs.objects.all()
    assert len(job.id) == 32  # the key's own default
    assert json.loads(bytes(job.payload)) == {
        "model": "outboxapp.comment",
        "pk": comment.pk,
        "event": "created",
    }


@pytest.mark.django_db(transaction=True)
def test_custom_key_and_payload_builders(registered: Any) -> None:
    seen: list[tuple[str, frozenset[str]]] = []

    def key(note: Note, *, event: str, changed: frozenset[str]) -> dict[str, Any]:
        return {"object_id": note.pk, "message_id": f"{event}-{note.text}"}

    def payload(note: Note, *, event: str, changed: frozenset[str]) -> dict[str, Any]:
        seen.append((event, changed))
        return {"text": note.text}

    registered(Note, queue="outboxapp.ModelEvents", key=key, payload=payload)
    with transaction.atomic():
        note = Note.objects.create(text="a")
        note.text = "b"
        note.save()
    assert sorted(ModelEvents.objects.values_list("message_id", flat=True)) == [
        "created-a",
        "updated-b",
    ]
    assert sorted(p["text"] for p in payloads(ModelEvents)) == ["a", "b"]
    assert seen == [("created", frozenset()), ("updated", frozenset({"text"}))]


@pytest.mark.django_db(transaction=True)
def test_bad_key_builder_aborts_with_a_clear_error(registered: Any) -> None:
    registered(Note, queue=ModelEvents, key=lambda note, **kw: {"colour": "red"})
    with pytest.raises(InvalidMessage, match=r"outbox outboxapp.Note created.*not a key field"):
        with transaction.atomic():
            Note.objects.create(text="x")
    assert not Note.objects.exists() and not ModelEvents.objects.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"queue": ModelEvents, "on": ("saved",)}, "events are created, updated, deleted"),
        ({"queue": ModelEvents, "fields": ("colour",)}, "'colour' is not a concrete field"),
        ({"queue": "outboxapp.Nope"}, "No queue named"),
        ({"queue": AuthorTasks}, "references outboxapp.Author"),
        ({"queue": UserEvents, "key": "not callable"}, "key must be a callable"),
    ],
)
def test_configuration_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(QueueError, match=message):
        outbox.register(Note, **options)
    assert outbox.registrations(Note) == []


def test_deleted_events_cannot_go_to_a_queue_interleaved_in_the_model() -> None:
    with pytest.raises(QueueConfigurationError, match="'deleted' message would be deleted"):
        outbox.register(Author, queue=AuthorTasks, on=("deleted",))
    assert len(outbox.registrations(Author)) == 2


def test_registering_twice_for_one_queue_is_an_error() -> None:
    with pytest.raises(QueueConfigurationError, match="already registered"):
        outbox.register(ProxyAuthor, queue="outboxapp.modelevents")


def test_unregister(registered: Any) -> None:
    registered(Note, queue=ModelEvents)
    registered(Note, queue=UserEvents, on="deleted")
    outbox.unregister(Note, UserEvents)
    assert [r.queue_label for r in outbox.registrations(Note)] == ["outboxapp.ModelEvents"]
    outbox.unregister(Note)
    assert outbox.registrations(Note) == []

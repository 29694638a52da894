"""Update filters: which field changes count, read from the row inside the transaction."""

from __future__ import annotations

import pytest
from django.db import transaction

from tests.outbox.conftest import payloads
from tests.outboxapp.models import Author, AuthorTasks, ModelEvents

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def author() -> Author:
    with transaction.atomic():
        author = Author.objects.create(name="ada", email="a@x", bio="")
    for event in ModelEvents.objects.all():  # by key: native queues take no DELETE ... WHERE true
        event.delete()
    for event in AuthorTasks.objects.all():  # by key: native queues take no DELETE ... WHERE true
        event.delete()
    return author


def updates(queue: type) -> list[list[str]]:
    return sorted(e["changed"] for e in payloads(queue) if e["event"] == "updated")


def test_only_tracked_fields_count(author: Author) -> None:
    # ModelEvents tracks name and email; AuthorTasks tracks every field.
    with transaction.atomic():
        author.bio = "new bio"
        author.save()
    assert updates(ModelEvents) == []
    assert updates(AuthorTasks) == [["bio"]]
    with transaction.atomic():
        author.email = "b@x"
        author.bio = "again"
        author.save()
    assert updates(ModelEvents) == [["email"]]  # only the tracked fields are reported
    assert updates(AuthorTasks) == [["bio"], ["bio", "email"]]


def test_a_save_that_changes_nothing_sends_nothing(author: Author) -> None:
    with transaction.atomic():
        author.save()
        Author.objects.get(pk=author.pk).save()
    assert not ModelEvents.objects.exists() and not AuthorTasks.objects.exists()


def test_changes_are_compared_with_the_row_not_the_loaded_instance(author: Author) -> None:
    stale = Author.objects.get(pk=author.pk)
    with transaction.atomic():
        author.name = "Ada"
        author.save()
    with transaction.atomic():
        stale.name = "Ada"  # the row already says "Ada": no change
        stale.save()
    assert updates(ModelEvents) == [["name"]]
    with transaction.atomic():
        stale.email = "a@x"  # unchanged in the row; but stale.name is still "Ada" too
        stale.save()
    assert updates(ModelEvents) == [["name"]]


def test_update_fields_limit_what_can_change(author: Author) -> None:
    with transaction.atomic():
        author.name = "not saved"
        author.bio = "saved"
        author.save(update_fields=["bio"])
    assert updates(ModelEvents) == []
    assert updates(AuthorTasks) == [["bio"]]
    assert Author.objects.get().name == "ada"


def test_values_are_compared_as_the_field_stores_them(author: Author) -> None:
    with transaction.atomic():
        row = Author.objects.get(pk=author.pk)
        row.name = "ada"  # same value, new string object
        row.save()
    assert updates(AuthorTasks) == []

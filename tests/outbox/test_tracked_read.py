"""The read that decides what an update changed (``changes.read_tracked``): the row's values
as ``filter(pk=...).values(...).first()`` gives them, through a statement compiled once."""

from __future__ import annotations

import datetime

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from spanner_queues.outbox.changes import read_tracked
from tests.outboxapp.models import Book, Tracked

pytestmark = pytest.mark.django_db(transaction=True)


def _orm(model: type, pk: object, names: tuple[str, ...]) -> dict | None:
    return model._base_manager.filter(pk=pk).values(*names).first()


def test_values_converted_as_the_orm_converts_them() -> None:
    """Datetimes, booleans and text come back as the ORM returns them (the backend's
    converters), so an unchanged field never looks changed."""
    user_model = get_user_model()
    with transaction.atomic():
        user = user_model.objects.create_user("ada", "ada@example.com", "pw")
        user.last_login = timezone.now() - datetime.timedelta(days=1)
        user.save()
    names = tuple(f.attname for f in user_model._meta.concrete_fields)
    with transaction.atomic():
        row = read_tracked(user_model, user.pk, names, "default")
        again = read_tracked(user_model, user.pk, names, "default")  # the cached statement
    assert row == again == _orm(user_model, user.pk, names)
    assert isinstance(row["last_login"], datetime.datetime) and row["is_active"] is True


def test_each_row_by_its_key_and_none_without_one() -> None:
    with transaction.atomic():
        first = Tracked.objects.create(name="a", counter=1)
        second = Tracked.objects.create(name="b", counter=2)
    names = ("name", "counter")
    assert read_tracked(Tracked, first.pk, names, "default") == {"name": "a", "counter": 1}
    assert read_tracked(Tracked, second.pk, names, "default") == {"name": "b", "counter": 2}
    assert read_tracked(Tracked, second.pk + 1000, names, "default") is None
    assert read_tracked(Tracked, first.pk, ("counter",), "default") == {"counter": 1}


def test_a_foreign_key_column_is_read_by_its_attname() -> None:
    author = Book._meta.get_field("author").related_model
    with transaction.atomic():
        book = Book.objects.create(author=author.objects.create(name="x"), title="t")
    names = ("author_id", "title", "pages")
    assert read_tracked(Book, book.pk, names, "default") == _orm(Book, book.pk, names)

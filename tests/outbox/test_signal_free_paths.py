"""bulk_create, QuerySet.update and raw deletes send no signals: ``outbox.send_for``."""

from __future__ import annotations

import pytest
from django.db import transaction

from spanner_queues import outbox
from spanner_queues.exceptions import TransactionRequired
from tests.outbox.conftest import payloads
from tests.outboxapp.models import Author, AuthorTasks, ModelEvents

pytestmark = pytest.mark.django_db(transaction=True)


def test_bulk_create_then_send_for() -> None:
    with transaction.atomic():
        authors = Author.objects.bulk_create([Author(name=n) for n in ("a", "b", "c")])
        assert not ModelEvents.objects.exists()  # bulk_create sends no signals
        sent = outbox.send_for(authors, event="created")
    assert len(sent) == 6  # ModelEvents and AuthorTasks, three each
    pks = {a.pk for a in authors}
    assert {e["pk"] for e in payloads(ModelEvents)} == pks
    assert set(AuthorTasks.objects.values_list("author_id", flat=True)) == pks


def test_queryset_update_then_send_for_filters_by_changed_fields() -> None:
    with transaction.atomic():
        authors = Author.objects.bulk_create([Author(name=n) for n in ("a", "b")])
    with transaction.atomic():
        ids = [a.pk for a in authors]
        Author.objects.filter(pk__in=ids).update(bio="bulk")
        outbox.send_for(Author.objects.filter(pk__in=ids), event="updated", changed=["bio"])
    assert not ModelEvents.objects.exists()  # bio is not tracked there
    assert AuthorTasks.objects.count() == 2


def test_raw_delete_then_send_for_before_the_rows_go() -> None:
    with transaction.atomic():
        authors = Author.objects.bulk_create([Author(name="a", email="a@x")])
    with transaction.atomic():
        doomed = Author.objects.filter(pk=authors[0].pk)
        outbox.send_for(doomed, event="deleted")
        doomed._raw_delete(doomed.db)
    [event] = payloads(ModelEvents)
    assert event["event"] == "deleted" and event["data"] == {"name": "a", "email": "a@x"}


def test_send_for_needs_the_changes_transaction() -> None:
    authors = Author.objects.bulk_create([Author(name="a")])  # autocommit: already committed
    with pytest.raises(TransactionRequired, match="send_for"):
        outbox.send_for(authors, event="created")
    assert not ModelEvents.objects.exists()
    with pytest.raises(ValueError, match="event must be one of"):
        outbox.send_for(authors, event="saved")
    assert outbox.send_for([], event="created") == []

"""The outbox guarantees, on every database: the message commits or rolls back with the row."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction

from spanner_queues import api
from spanner_queues.exceptions import PayloadError, TransactionRequired
from tests.outbox.conftest import payloads
from tests.outboxapp.models import Author, AuthorTasks, Book, ModelEvents, Note, ProxyAuthor

pytestmark = pytest.mark.django_db(transaction=True)


def test_commit_gives_exactly_one_message_per_event() -> None:
    with transaction.atomic():
        author = Author.objects.create(name="ada", email="ada@example.com")
    pk = author.pk
    with transaction.atomic():
        author.name = "Ada"
        author.save()
    with transaction.atomic():
        author.delete()  # Author is registered for every event with ModelEvents
    events = payloads(ModelEvents, object_id=pk)
    assert sorted(e["event"] for e in events) == ["created", "deleted", "updated"]
    by_event = {e["event"]: e for e in events}
    assert by_event["created"] == {"model": "outboxapp.author", "pk": pk, "event": "created"}
    assert by_event["updated"] == {
        "model": "outboxapp.author",
        "pk": pk,
        "event": "updated",
        "changed": ["name"],
    }
    assert by_event["deleted"]["data"] == {"name": "Ada", "email": "ada@example.com"}
    # AuthorTasks (interleaved in Author) got created + updated, then went with the row.
    assert ModelEvents.objects.count() == 3 and not AuthorTasks.objects.exists()


def test_message_is_receivable_after_commit_with_the_model_key() -> None:
    with transaction.atomic():
        author = Author.objects.create(name="ada")
    [task] = api.receive(AuthorTasks)
    assert task.key_dict["author_id"] == author.pk
    assert len(task.key_dict["message_id"]) == 32
    assert task.json() == {"model": "outboxapp.author", "pk": author.pk, "event": "created"}


def test_rollback_gives_no_message() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        Author.objects.create(name="ada")
        raise RuntimeError("boom")
    assert not Author.objects.exists()
    assert not ModelEvents.objects.exists() and not AuthorTasks.objects.exists()

    with transaction.atomic():
        author = Author.objects.create(name="bob")
    with pytest.raises(RuntimeError), transaction.atomic():
        author.name = "Bob"
        author.save()
        Book.objects.create(author=author, title="t")
        author.delete()
        raise RuntimeError("boom")
    assert Author.objects.get().name == "bob"
    assert [e["event"] for e in payloads(ModelEvents)] == ["created"]
    assert AuthorTasks.objects.count() == 1


def _failing(instance: Any, **kwargs: Any) -> Any:
    raise ValueError("no payload today")


def _unserialisable(instance: Any, **kwargs: Any) -> Any:
    return {"when": object()}


@pytest.mark.parametrize("builder", [_failing, _unserialisable])
def test_failing_payload_builder_leaves_neither_row_nor_message(
    registered: Any, builder: Any
) -> None:
    registered(Note, queue=ModelEvents, payload=builder)
    with pytest.raises(
        PayloadError, match=r"outbox outboxapp.Note created -> outboxapp.ModelEvents"
    ):
        with transaction.atomic():
            Note.objects.create(text="x")
    assert not Note.objects.exists()
    assert not ModelEvents.objects.exists()


def test_failing_payload_builder_cannot_commit_the_row_even_if_caught(registered: Any) -> None:
    """With a database-assigned key the row is written before the payload can be built; the
    failure then marks the transaction for rollback (no savepoints needed)."""
    registered(Note, queue=ModelEvents, payload=_failing)
    with transaction.atomic():
        try:
            Note.objects.create(text="x")
        except PayloadError:
            pass
    assert not Note.objects.exists()
    assert not ModelEvents.objects.exists()


def test_failing_payload_builder_on_update_and_delete_keeps_the_row(registered: Any) -> None:
    note = Note.objects.create(text="before")  # not registered yet: autocommit is fine
    registered(Note, queue=ModelEvents, on=("updated", "deleted"), payload=_failing)
    with pytest.raises(PayloadError, match="updated"), transaction.atomic():
        note.text = "after"
        note.save()
    with pytest.raises(PayloadError, match="deleted"):
        Note.objects.get().delete()
    assert Note.objects.get().text == "before"
    assert not ModelEvents.objects.exists()


def test_autocommit_save_is_refused_before_anything_is_written() -> None:
    assert not connection.in_atomic_block
    with pytest.raises(TransactionRequired, match=r"Author.save\(\) outside transaction.atomic"):
        Author.objects.create(name="ada")
    assert not Author.objects.exists()
    with transaction.atomic():
        author = Author.objects.create(name="ada")
    author.name = "changed"
    with pytest.raises(TransactionRequired, match="Wrap it"):
        author.save()
    assert Author.objects.get().name == "ada"
    assert ModelEvents.objects.count() == 1
    Note.objects.create(text="unregistered models are not affected")


def test_autocommit_save_that_cannot_send_is_allowed() -> None:
    """Only a save that provably sends nothing runs in autocommit: ``update_fields`` naming no
    tracked field (like Django's ``update_last_login``). A plain ``save()`` of a loaded instance
    may turn into an INSERT (if the row is gone), so it is refused for 'created' too."""
    with transaction.atomic():
        author = Author.objects.create(name="ada")
        book = Book.objects.create(author=author, title="t")
    book.pages = 10
    book.save(update_fields=["pages"])  # Book sends on created/deleted only
    assert Book.objects.get().pages == 10
    book.pages = 11
    with pytest.raises(TransactionRequired):
        book.save()
    assert Book.objects.get().pages == 10


def test_deletes_are_atomic_in_autocommit_too() -> None:
    """Django's deletion runs its signals inside atomic(): no atomic() needed."""
    with transaction.atomic():
        author = Author.objects.create(name="ada")
    pk = author.pk
    author.delete()
    assert not Author.objects.exists()
    assert sorted(e["event"] for e in payloads(ModelEvents, object_id=pk)) == ["created", "deleted"]


def test_delete_with_cascades_sends_for_every_registered_row() -> None:
    with transaction.atomic():
        author = Author.objects.create(name="ada", email="a@x")
        books = [Book.objects.create(author=author, title=t) for t in ("one", "two")]
        books[0].reviews.create(text="unregistered, cascaded silently")
    for event in ModelEvents.objects.all():  # by key: native queues take no DELETE ... WHERE true
        event.delete()
    author_pk = author.pk
    with transaction.atomic():
        Author.objects.filter(pk=author_pk).delete()  # QuerySet.delete sends signals too
    events = payloads(ModelEvents)
    assert sorted((e["model"], e["pk"], e["event"]) for e in events) == sorted(
        [("outboxapp.author", author_pk, "deleted")]
        + [("outboxapp.book", b.pk, "deleted") for b in books]
    )
    data = sorted(e["data"]["title"] for e in events if e["model"] == "outboxapp.book")
    assert data == ["one", "two"]
    assert all(e["data"]["author"] == author_pk for e in events if e["model"] == "outboxapp.book")
    assert not AuthorTasks.objects.exists()  # interleaved in the author: gone with it


def test_save_through_a_proxy_counts() -> None:
    with transaction.atomic():
        ProxyAuthor.objects.create(name="proxy")
    assert [e["model"] for e in payloads(ModelEvents)] == ["outboxapp.author"]
    with pytest.raises(TransactionRequired):
        ProxyAuthor.objects.create(name="autocommit")


@pytest.mark.requires("stores_bookkeeping_fields")  # reads the send_time column
def test_outbox_and_send_encode_payloads_with_one_configurable_encoder(registered: Any) -> None:
    """send() refused {"at": datetime} (PayloadError) while the outbox encoded the same dict
    with DjangoJSONEncoder. Now both use the engine's JSON_ENCODER (DjangoJSONEncoder by
    default), so datetimes, Decimals and UUIDs come out the same."""
    import json
    import uuid
    from decimal import Decimal

    from django.core.serializers.json import DjangoJSONEncoder
    from django.test import override_settings
    from django.utils import timezone

    document = {"at": timezone.now(), "amount": Decimal("1.10"), "ref": uuid.uuid4()}
    expected = json.loads(json.dumps(document, cls=DjangoJSONEncoder))
    registered(Note, queue=ModelEvents, payload=lambda note, **kw: document)
    with transaction.atomic():
        Note.objects.create(text="x")
    [from_outbox] = payloads(ModelEvents)
    sent = api.send(ModelEvents, object_id=1, message_id="sent", payload=document)
    assert from_outbox == expected == sent.json()

    class SetsAsLists(DjangoJSONEncoder):
        def default(self, o: Any) -> Any:
            return sorted(o) if isinstance(o, set) else super().default(o)

    setting = {"default": {"OPTIONS": {"JSON_ENCODER": SetsAsLists}}}
    with override_settings(SPANNER_QUEUES=setting):
        sent = api.send(ModelEvents, object_id=2, message_id="s", payload={"tags": {"b", "a"}})
        assert sent.json() == {"tags": ["a", "b"]}
    with pytest.raises(PayloadError):
        api.send(ModelEvents, object_id=3, message_id="s", payload={"tags": {"b", "a"}})


def test_a_failed_save_leaves_no_plan_behind_for_a_later_save(registered: Any) -> None:
    """pre_save stashed its plan on the instance; a save that failed before post_save left it
    there, and a later save that should send nothing popped it and sent a spurious message."""
    from django.db.models.signals import pre_save

    from tests.outboxapp.models import Plain

    registered(
        Plain,
        queue=ModelEvents,
        fields=("name",),
        key=lambda p, **kw: {"object_id": p.pk, "message_id": f"{kw['event']}-{p.name}"},
    )
    with transaction.atomic():
        plain = Plain.objects.create(name="a")
    assert ModelEvents.objects.count() == 1  # created

    def fail(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("the save fails after the outbox planned its message")

    pre_save.connect(fail, sender=Plain)
    try:
        plain.name = "b"
        with pytest.raises(RuntimeError), transaction.atomic():
            plain.save()
    finally:
        pre_save.disconnect(fail, sender=Plain)
    plain.counter = 5
    with transaction.atomic():
        plain.save(update_fields=["counter"])  # no tracked field changed: no message
    assert ModelEvents.objects.count() == 1


def test_send_for_outside_atomic_is_refused_even_with_nothing_registered() -> None:
    from spanner_queues import outbox
    from tests.outboxapp.models import Plain

    plain = Plain.objects.create(name="p")
    with pytest.raises(TransactionRequired):
        outbox.send_for([plain], event="updated")
    with transaction.atomic():
        assert outbox.send_for([plain], event="updated") == []


def test_outbox_queryset_refuses_signal_free_writes_of_registered_models(registered: Any) -> None:
    from spanner_queues import outbox
    from spanner_queues.exceptions import OutboxBypassed
    from tests.outboxapp.models import Plain

    rows = outbox.OutboxQuerySet(model=Plain)
    rows.bulk_create([Plain(name="unregistered")])  # nothing registered: allowed
    registered(Plain, queue=ModelEvents, key=lambda p, **kw: {"object_id": p.pk, "message_id": "m"})
    for write in (
        lambda: rows.bulk_create([Plain(name="x")]),
        lambda: rows.update(counter=1),
        lambda: rows.bulk_update(list(Plain.objects.all()), ["counter"]),
    ):
        with pytest.raises(OutboxBypassed), transaction.atomic():
            write()
    assert list(Plain.objects.values_list("counter", flat=True)) == [0]
    with transaction.atomic(), outbox.manual_send():
        rows.update(counter=2)
        outbox.send_for(Plain.objects.all(), event="updated", changed=["counter"])
    assert list(Plain.objects.values_list("counter", flat=True)) == [2]
    assert ModelEvents.objects.count() == 1

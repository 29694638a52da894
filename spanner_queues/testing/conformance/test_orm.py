"""Conformance: messages are rows you can query, never update; interleaving cascades."""

from __future__ import annotations

import pytest
from django.db import connection

from spanner_queues.drivers import driver_for
from spanner_queues.exceptions import InvalidMessage, MessageUpdateRefused
from spanner_queues.testing.conformance.models import Upload, UploadTasks, UserTasks
from spanner_queues.testing.conformance.support import receive_due

pytestmark = pytest.mark.django_db(transaction=True)


def test_messages_are_queryable_rows() -> None:
    UserTasks.send_many(
        [{"user_id": u, "message_id": str(i), "payload": "x"} for u in (1, 2) for i in range(3)]
    )
    assert UserTasks.objects.filter(user_id=1).count() == 3
    assert set(UserTasks.objects.filter(user_id=2).values_list("message_id", flat=True)) == {
        "0",
        "1",
        "2",
    }
    assert UserTasks.objects.get(pk=(2, "1")).as_message().key == (2, "1")


def test_orm_update_is_refused() -> None:
    UserTasks.send(user_id=1, message_id="a", payload="x")
    with pytest.raises(MessageUpdateRefused, match="no UPDATE"):
        UserTasks.objects.filter(user_id=1).update(payload=b"y")
    row = UserTasks.objects.get(pk=(1, "a"))
    row.payload = b"changed"
    with pytest.raises(MessageUpdateRefused):
        row.save()
    with pytest.raises(MessageUpdateRefused):
        UserTasks.objects.bulk_update([row], ["payload"])
    assert bytes(UserTasks.objects.get(pk=(1, "a")).payload) == b"x"


def test_orm_create_and_delete_work() -> None:
    UserTasks.objects.create(user_id=3, message_id="orm", payload=b"direct")
    assert [m.key for m in receive_due(UserTasks)] == [(3, "orm")]
    assert UserTasks.objects.filter(user_id=3).delete()[0] == 1


def test_interleaved_queue_is_deleted_with_its_parent() -> None:
    keep, drop = Upload.objects.create(name="keep"), Upload.objects.create(name="drop")
    UploadTasks.send_many(
        [{"upload": u.pk, "message_id": m, "payload": ""} for u in (keep, drop) for m in "ab"]
    )
    drop.delete()
    assert sorted(UploadTasks.objects.values_list("upload_id", "message_id")) == [
        (keep.pk, "a"),
        (keep.pk, "b"),
    ]


def test_interleaved_cascade_in_the_database_where_supported() -> None:
    if not driver_for("default").supports_interleave:
        pytest.skip("this database has no INTERLEAVE; the ORM cascade test covers it")
    parent = Upload.objects.create(name="raw")
    UploadTasks.send(upload=parent.pk, message_id="m", payload="")
    with connection.cursor() as cursor:  # bypass Django's collector: the database cascades
        cursor.execute(f"DELETE FROM {Upload._meta.db_table} WHERE id = %s", [parent.pk])
    assert not UploadTasks.objects.filter(upload_id=parent.pk).exists()


def test_interleaved_send_without_parent_is_refused() -> None:
    with pytest.raises(InvalidMessage, match="create the parent first"):
        UploadTasks.send(upload=987654321, message_id="orphan", payload="")
    assert not UploadTasks.objects.exists()

"""Regressions for the native-engine review: key conversion, all-or-nothing send_many."""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta

import grpc
import pytest
from django.db import connection, connections, models
from django.test.utils import isolate_apps
from django.utils import timezone

from spanner_queues import api
from spanner_queues.engines import engines
from spanner_queues.exceptions import (
    MessageAlreadyExists,
    NotSupportedByEngine,
    QueueConfigurationError,
    UnknownQueue,
)
from spanner_queues.message import OutgoingMessage
from spanner_queues.models import Queue
from spanner_queues.options import queue_options
from tests.conftest import wait_until
from tests.testapp.models import UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_send_many_outside_a_transaction_is_all_or_nothing(front) -> None:
    """An immediate and a delayed message are two INSERTs: one transaction for both."""
    later = timezone.now() + timedelta(hours=1)
    UserTasks.send(user_id=1, message_id="dup", payload="")
    with pytest.raises(MessageAlreadyExists):
        api.send_many(
            UserTasks,
            [
                {"user_id": 1, "message_id": "new", "payload": ""},
                {"user_id": 1, "message_id": "dup", "payload": "", "deliver_time": later},
            ],
        )
    assert not UserTasks.objects.filter(user_id=1, message_id="new").exists()


def test_uuid_key_is_sent_as_the_32_char_hex_the_column_holds(monkeypatch) -> None:
    """UUIDField keys get STRING(32) and the ORM writes ``.hex``: so must send_many."""
    with isolate_apps("tests.testapp"):

        class UuidTasks(Queue):
            id = models.UUIDField(primary_key=True)

            class Meta:
                app_label = "testapp"

    engine = engines["default"]
    assert "id STRING(32) NOT NULL" in engine.dialect.create_queue(engine.declaration(UuidTasks))
    sent: list = []

    class Cursor:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def execute(self, sql, params=None):
            sent.append(params)

    key = uuid.uuid4()
    with monkeypatch.context() as patched:  # undone before the teardown reads the database
        patched.setattr(connections["default"], "cursor", lambda: Cursor())
        engine.send_many(
            UuidTasks, [OutgoingMessage(key={"id": key}, payload=b"")], using="default"
        )
    from google.cloud.spanner_v1._helpers import _make_value_pb

    wire = _make_value_pb(sent[0][0]).string_value
    assert wire == key.hex, f"{wire!r} ({len(wire)} chars) goes into a STRING(32) column"


@pytest.mark.parametrize(
    ("field", "value", "wire"),
    [
        (models.UUIDField, uuid.UUID(int=0xABC), uuid.UUID(int=0xABC).hex),
        (models.BinaryField, b"\x00\xffk", "AP9r"),
    ],
    ids=["uuid", "bytes"],
)
def test_key_round_trip_send_receive_ack(front, field, value, wire) -> None:
    with isolate_apps("tests.testapp"):

        class OddKeyTasks(Queue):
            id = field(primary_key=True, max_length=16)

            class Meta:
                app_label = "testapp"

    engine = engines["default"]
    with connection.schema_editor() as editor:
        engine.create_queue(editor, OddKeyTasks, queue_options(OddKeyTasks))
    try:
        out = OutgoingMessage(key={"id": value}, payload=b"p")
        engine.send_many(OddKeyTasks, [out], using="default")
        [insert] = front.sql("INSERT INTO testapp_oddkeytasks")
        assert insert.request.params["a0"] == wire
        [message] = wait_until(lambda: engine.receive(OddKeyTasks))
        assert message.key == (value,) and message.payload == b"p"
        front.clear()
        engine.ack_many(OddKeyTasks, [message.key], using="default")
        [delete] = front.sql("DELETE FROM testapp_oddkeytasks")
        assert delete.request.params["a0"] == wire
        engine.send_mutations(OddKeyTasks, [out])
        assert list(front.commits()[-1].mutations[0].send.key) == [wire]
        engine.ack_mutations(OddKeyTasks, [(value,)])
        assert list(front.commits()[-1].mutations[0].ack.key) == [wire]
        with pytest.raises(MessageAlreadyExists):
            engine.send_mutations(OddKeyTasks, [out, out])
    finally:
        front.end_streams()  # end the stream so the receiver's thread finishes now
        engine.stop_receiving(OddKeyTasks, wait=5)
        with connection.schema_editor() as editor:
            engine.drop_queue(editor, OddKeyTasks, queue_options(OddKeyTasks))


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, QueueConfigurationError),
        (grpc.StatusCode.NOT_FOUND, UnknownQueue),
        (grpc.StatusCode.PERMISSION_DENIED, QueueConfigurationError),
        (grpc.StatusCode.UNIMPLEMENTED, NotSupportedByEngine),
        (grpc.StatusCode.FAILED_PRECONDITION, QueueConfigurationError),
    ],
)
def test_permanent_receive_errors_surface(front, code, error) -> None:
    # A probe refused with INVALID_ARGUMENT (it may be its tiny max_duration, in any words) is
    # asked once more in a long call; that call's refusal is permanent.
    calls = 2 if code == grpc.StatusCode.INVALID_ARGUMENT else 1
    front.fail("ExecuteStreamingSql", code, "no such thing", sql_contains="RECEIVE_", times=calls)
    with pytest.raises(error, match="no such thing") as raised:
        api.receive(UserTasks)
    assert raised.value.grpc_status == code.name
    assert len(front.sql("RECEIVE_")) == calls  # not retried further
    UserTasks.send(user_id=1, message_id="a", payload="x")  # the next call starts afresh
    assert wait_until(lambda: api.receive(UserTasks))[0].key == (1, "a")


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INTERNAL,
    ],
)
def test_transient_receive_errors_are_retried_and_logged(front, code, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="spanner_queues.engines.native.receive")
    front.fail("ExecuteStreamingSql", code, "try again", sql_contains="RECEIVE_", times=2)
    UserTasks.send(user_id=1, message_id="a", payload="x")
    assert wait_until(lambda: api.receive(UserTasks))[0].key == (1, "a")
    assert len(front.sql("RECEIVE_")) >= 2
    assert "try again" in caplog.text


def test_rows_without_resume_tokens_are_not_held_until_the_stream_ends(front) -> None:
    """RECEIVE runs below Snapshot.execute_sql, whose _restart_on_unavailable would buffer
    PartialResultSets until one carries a resume token (here: never, until max_duration)."""
    front.configure(resume_tokens=False)
    UserTasks.send(user_id=1, message_id="a", payload="x")
    deadline = time.monotonic() + 3.0  # the stream's max_duration is 5 s
    got: list = []
    while not got and time.monotonic() < deadline:
        got = api.receive(UserTasks)
    assert got, "the leased row sat in the client's buffer until the stream ended"


def test_stop_cancels_the_stream(front) -> None:
    """stop() cancels the gRPC call: the receiver's thread ends without the stream ending."""
    engine = engines["default"]
    api.receive(UserTasks)
    from spanner_queues.engines.native import _streams

    receiver = _streams[(engine.alias, UserTasks._meta.label)]
    assert receiver.running
    thread = receiver._thread
    engine.stop_receiving(UserTasks)
    thread.join(4.0)  # well within the stream's max_duration (5 s): only cancel() ends it
    assert not thread.is_alive()  # (nothing ended the stream from the front's side)

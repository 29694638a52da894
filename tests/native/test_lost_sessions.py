"""A lost session on the RECEIVE stream (real Spanner answers ``NOT_FOUND: Session not found``
once it dropped the session; the front serves RECEIVE itself and cannot show it): the error
the stream raises still says so, so the worker closes the connection and the next receive opens
a stream on a new one (``transactions.forget_lost_connection``)."""

from __future__ import annotations

import grpc
import pytest
from django.db import connection

from spanner_queues import api
from spanner_queues.drivers import driver_for
from spanner_queues.exceptions import UnknownQueue
from spanner_queues.transactions import forget_lost_connection
from tests.conftest import wait_until
from tests.testapp.models import UserTasks

pytestmark = pytest.mark.django_db(transaction=True)

LOST = "Session not found: projects/p/instances/i/databases/d/sessions/gone"


def test_a_lost_session_on_the_receive_stream_is_recognised_and_the_connection_replaced(
    front,
) -> None:
    front.fail("ExecuteStreamingSql", grpc.StatusCode.NOT_FOUND, LOST, sql_contains="RECEIVE_")
    with pytest.raises(UnknownQueue) as raised:
        api.receive(UserTasks)
    assert driver_for("default").is_connection_lost(raised.value)
    before = connection.connection
    assert forget_lost_connection(raised.value, "default")
    assert connection.connection is None  # closed: the next use reconnects
    UserTasks.send(user_id=1, message_id="a", payload="x")
    assert wait_until(lambda: api.receive(UserTasks))[0].key == (1, "a")
    assert connection.connection is not None and connection.connection is not before


def test_a_missing_queue_is_not_a_lost_connection(front) -> None:
    front.fail(
        "ExecuteStreamingSql",
        grpc.StatusCode.NOT_FOUND,
        "Table not found: Q",
        sql_contains="RECEIVE_",
    )
    with pytest.raises(UnknownQueue) as raised:
        api.receive(UserTasks)
    assert not driver_for("default").is_connection_lost(raised.value)

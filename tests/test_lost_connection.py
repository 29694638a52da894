"""A connection the database ended (PostgreSQL: a terminated backend, a restart) is closed and
the library's transaction runs again on a new one, instead of failing every later delivery of
an idle worker thread (the fault drill found messages failing 56 attempts in a row this way)."""

from __future__ import annotations

import pytest
from django.db import connection, connections

from spanner_queues import api
from spanner_queues.drivers import driver_for
from spanner_queues.transactions import run_in_transaction
from tests.testapp.models import UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


def _terminate_this_connections_backend() -> None:
    """End this thread's server session from another connection, as pg_terminate_backend
    (or a restart) does; this connection notices on its next query."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    import psycopg

    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"], port=settings["PORT"], user=settings["USER"],
        dbname=settings["NAME"], autocommit=True,
    ) as other:  # fmt: skip
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_a_transaction_on_a_connection_the_server_ended_runs_again_on_a_new_one() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL ends sessions with pg_terminate_backend")
    UserTasks.send(user_id=1, message_id="a", payload="x")
    _terminate_this_connections_backend()
    [message] = run_in_transaction(lambda: api.receive(UserTasks), using="default")
    assert message.key == (1, "a")
    # and an ack in a receiver's transaction on a connection that was ended meanwhile
    _terminate_this_connections_backend()
    run_in_transaction(lambda: api.ack(message), using="default")
    assert not UserTasks.objects.exists()


def test_only_a_lost_connection_counts_as_lost() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's connection errors")
    driver = driver_for("default")
    assert not driver.is_connection_lost(ValueError("no"))
    connections["default"].ensure_connection()
    assert not driver.is_connection_lost(RuntimeError("serialization"))

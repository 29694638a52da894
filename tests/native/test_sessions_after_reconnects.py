"""Spanner sessions stay flat when Django reconnects (issue 37, "Sessions after outages"): each
new connection used to build its own google-cloud-spanner ``Database`` and with it a new
multiplexed session on the server, which nothing deletes; a worker that reconnected after each
of five outages left five more. Every connection of a process to one database now shares one
``Database`` (``SpannerDriver.connection_created``), until its session is lost."""

from __future__ import annotations

import pytest
from django.db import connection, connections

pytestmark = pytest.mark.django_db(transaction=True)


def _sessions() -> int:
    database = connection.connection.database
    return len(list(database.spanner_api.list_sessions(database=database.name)))


def _query() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchall() == [(1,)]


def test_reconnecting_five_times_leaves_the_session_count_where_it_was() -> None:
    _query()
    start = _sessions()
    for _ in range(5):
        connections.close_all()  # as the worker does after a lost connection or an outage
        _query()
    assert _sessions() <= start


def test_connections_of_several_threads_share_one_database() -> None:
    import threading

    seen = []

    def use() -> None:
        _query()
        seen.append(connection.connection.database)
        connection.close()

    threads = [threading.Thread(target=use) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    _query()
    assert len({id(d) for d in [*seen, connection.connection.database]}) == 1

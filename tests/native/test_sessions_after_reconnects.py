"""Spanner sessions stay flat when Django reconnects (issue 37, "Sessions after outages"): each
new connection used to build its own google-cloud-spanner ``Database`` and with it a new
multiplexed session on the server, which nothing deletes; a worker that reconnected after each
of five outages left five more. A thread that reconnects now gets the ``Database`` of its
last connection (``SpannerDriver.connection_created``), until its session is lost; threads
keep their own (Google's emulator refuses concurrent read-write transactions on one
multiplexed session)."""

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


def test_a_thread_reconnecting_keeps_its_database_and_threads_keep_their_own() -> None:
    import threading

    _query()
    mine = connection.connection.database
    connections.close_all()
    _query()
    assert connection.connection.database is mine
    theirs = []

    def use() -> None:
        _query()
        theirs.append(connection.connection.database)
        connection.close()

    thread = threading.Thread(target=use)
    thread.start()
    thread.join(60)
    assert theirs and theirs[0] is not mine


def test_a_finished_thread_gives_its_database_to_the_next_thread() -> None:
    """A worker replaces the threads an outage ended: ten threads one after another hold one
    session between them, not ten, and two threads alive at once still hold one each."""
    import threading

    _query()
    start = _sessions()
    seen: list[object] = []

    def use(ready: threading.Event | None = None, go: threading.Event | None = None) -> None:
        _query()
        seen.append(connection.connection.database)
        if ready is not None and go is not None:
            ready.set()
            go.wait(60)
        connection.close()

    for _ in range(10):
        thread = threading.Thread(target=use)
        thread.start()
        thread.join(60)
    assert len({id(database) for database in seen}) == 1
    assert _sessions() <= start + 1

    seen.clear()
    ready = [threading.Event(), threading.Event()]
    go = threading.Event()
    both = [threading.Thread(target=use, args=(r, go)) for r in ready]
    for thread in both:
        thread.start()
    assert all(r.wait(60) for r in ready)
    go.set()
    for thread in both:
        thread.join(60)
    assert seen[0] is not seen[1]
    assert _sessions() <= start + 2

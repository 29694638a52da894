"""What a worker that runs for days meets on the wire: a commit during an outage gives up after
``COMMIT_DEADLINE_SECONDS`` (the client's default retries it for an hour); the worker is
unready within ``db_check_timeout`` while its database does not answer; a restarting
``RECEIVE`` stream warns once per episode; and a closed connection stops its client's
session-maintenance thread (which it otherwise keeps for good)."""

from __future__ import annotations

import logging
import threading
import time

import grpc
import pytest
from django.db import connections, transaction
from google.api_core.exceptions import RetryError, ServiceUnavailable

from spanner_queues import api
from spanner_queues.engines.native import client
from spanner_queues.worker import Worker, WorkerEvent
from spanner_queues.worker.health import WorkerHealth
from tests.conftest import wait_until
from tests.testapp.models import Jobs, UserTasks
from tests.workerapp.models import WorkItems

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_commit_during_an_outage_gives_up_after_the_commit_deadline(
    front, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "COMMIT_DEADLINE_SECONDS", 2.0)
    connections["default"].close()  # a connection made with the deadline above
    front.fail("Commit", grpc.StatusCode.UNAVAILABLE, "outage", times=1000)
    failures: list[BaseException] = []
    done = threading.Event()

    def send() -> None:
        try:
            with transaction.atomic():
                api.send(UserTasks, user_id=1, message_id="m", payload=b"x")
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()
            done.set()

    started = time.monotonic()
    threading.Thread(target=send, daemon=True).start()
    try:
        assert done.wait(30), "the commit is still being retried"
    finally:
        front.clear()
    assert time.monotonic() - started < 15
    [failure] = failures
    # the client's own error: its retries ran out on the front's UNAVAILABLE
    assert isinstance(failure, RetryError), repr(failure)
    assert isinstance(failure.cause, ServiceUnavailable), repr(failure.cause)


def test_a_closed_connection_stops_its_session_maintenance_thread() -> None:
    managers = []

    def use_and_close() -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchall()
        managers.append(connections["default"].connection.database._sessions_manager)
        connections["default"].close()

    thread = threading.Thread(target=use_and_close)
    thread.start()
    thread.join(60)
    [manager] = managers
    assert manager._multiplexed_session_thread is not None  # the client started one
    assert manager._multiplexed_session_terminate_event.is_set()


def test_a_restarting_receive_stream_warns_once_then_logs_at_debug_and_says_it_recovered(
    front, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="spanner_queues.engines")
    front.fail(
        "ExecuteStreamingSql",
        grpc.StatusCode.UNAVAILABLE,
        "outage",
        sql_contains="RECEIVE_",
        times=4,
    )
    Jobs.send(payload="a")
    assert wait_until(lambda: api.receive(Jobs), timeout=60)[0].payload == b"a"
    failed = [
        r for r in caplog.records if "RECEIVE stream for testapp.Jobs failed" in r.getMessage()
    ]
    assert [r.levelno for r in failed] == [logging.WARNING] + [logging.DEBUG] * 3, [
        (r.levelname, r.getMessage()) for r in failed
    ]
    assert "further failures" in failed[0].getMessage()
    assert wait_until(
        lambda: [r for r in caplog.records if "recovered after 4 failed calls" in r.getMessage()],
        timeout=30,
    )


def test_a_worker_is_unready_at_once_while_its_database_does_not_answer(front) -> None:

    health = WorkerHealth(db_check_seconds=0, db_check_timeout=1.0)
    health.attach(Worker([WorkItems], install_signal_handlers=False))
    health(WorkerEvent(name="worker_started", worker_id="w"))
    assert wait_until(lambda: health.readiness() == [], timeout=30)
    front.fail("ExecuteStreamingSql", grpc.StatusCode.UNAVAILABLE, "outage", times=10**6)
    started = time.monotonic()
    [problem] = health.readiness()
    assert time.monotonic() - started < 5  # the probe answers; the client retries 30 s
    assert problem == "the databases did not answer within 1 s"
    front.clear()
    assert wait_until(lambda: health.readiness() == [], timeout=60)


def test_an_aborted_statement_is_replayed_after_the_fronts_retry_delay_not_seconds(
    front, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cloud Spanner puts a ``RetryInfo`` on every ABORTED it returns, and the DB-API's replay
    of an aborted transaction waits what it says. Without one (Google's emulator sends none)
    the DB-API waits ``2**attempt`` seconds: 2, 4, 8... A worker on the emulator whose ack was
    aborted a few times in a row slept for minutes and did not exit on SIGTERM (the one-hour
    soak). The front answers ABORTED as Spanner does."""
    from google.cloud.spanner_dbapi import transaction_helper

    delays: list[float] = []
    real = transaction_helper._get_retry_delay

    def recorded(cause: object, attempts: int, default_retry_delay: object = None) -> float:
        delays.append(real(cause, attempts, default_retry_delay=default_retry_delay))
        return delays[-1]

    monkeypatch.setattr(transaction_helper, "_get_retry_delay", recorded)
    with transaction.atomic():
        api.send(Jobs, payload={"n": 1})  # the transaction's first statement
        # the second send aborted, and the replay's first statement too: the DB-API waits
        # before its second replay
        front.fail("ExecuteStreamingSql", "ABORTED", "aborted", sql_contains="INSERT", times=2)
        api.send(Jobs, payload={"n": 2})
    assert len(delays) == 1, delays
    assert 0 < delays[0] < 0.1, f"the replay waited {delays[0]:.2f} s"
    assert Jobs.objects.count() == 2


def test_an_aborted_statement_without_retry_info_is_replayed_after_a_short_delay(
    front, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether every ABORTED of Cloud Spanner carries a ``RetryInfo`` is not documented (the
    front plays both answers: ``retry_info``). Without one the DB-API would wait
    ``2**attempt`` seconds before each replay; the engine's connections wait
    ``ABORTED_REPLAY_DELAY_SECONDS`` instead, whatever Spanner sends."""
    from google.cloud.spanner_dbapi import transaction_helper

    front.configure(retry_info="never")
    delays: list[float] = []
    real = transaction_helper._get_retry_delay

    def recorded(cause: object, attempts: int, default_retry_delay: object = None) -> float:
        delays.append(real(cause, attempts, default_retry_delay=default_retry_delay))
        return delays[-1]

    monkeypatch.setattr(transaction_helper, "_get_retry_delay", recorded)
    with transaction.atomic():
        api.send(Jobs, payload={"n": 1})
        front.fail("ExecuteStreamingSql", "ABORTED", "aborted", sql_contains="INSERT", times=2)
        api.send(Jobs, payload={"n": 2})
    assert delays == [client.ABORTED_REPLAY_DELAY_SECONDS]
    assert Jobs.objects.count() == 2

"""The test kit (spanner_queues.testing), as docs/howto/testing.md shows it: each test here is
the documentation's example for one helper."""

from __future__ import annotations

import importlib.util
import sys
import threading
from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.test import TestCase
from django.utils import timezone

from spanner_queues import clock as spanner_clock
from spanner_queues import patterns
from spanner_queues.testing import (
    ClockNotMovable,
    assert_sent,
    clock_is_movable,
    drain,
    moved_clock,
    sent,
)
from tests.tasksapp.models import Notifications, Thing

pytest_plugins = ["spanner_queues.testing.pytest_plugin"]


# --- assert what was sent ----------------------------------------------------------------------
@pytest.mark.django_db
def test_signup_sends_a_notification():
    with transaction.atomic():
        Notifications.send(id="welcome-1", payload={"num": 1, "kind": "welcome"})
    [message] = assert_sent(Notifications, kind="welcome")
    assert message.key_dict == {"id": "welcome-1"}
    assert_sent(Notifications, count=1, id="welcome-1")
    with pytest.raises(AssertionError, match="found 0"):
        assert_sent(Notifications, kind="goodbye")


# --- drain a queue and get the outcomes ----------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_drain_runs_the_receivers_and_reports_outcomes():
    Notifications.send(id="a", payload={"num": 1})
    Notifications.send(id="b", payload={"kind": "busy"})
    Notifications.send(id="c", payload={"kind": "broken"})
    outcomes = drain(Notifications)
    assert [o.message.key for o in outcomes.acked] == [("a",)]
    assert [o.message.key for o in outcomes.retried] == [("b",)]
    # c fails (again, if its back-off ends while the drain runs: drain runs what is due)
    assert {(o.message.key, str(o.error)) for o in outcomes.failed} == {(("c",), "cannot notify")}
    assert list(Thing.objects.values_list("num", flat=True)) == [1]  # the receiver's write
    assert [m.key for m in sent(Notifications)] == [("c",), ("b",)]  # c backs off, b in 5 min


@pytest.mark.django_db(transaction=True)
def test_the_fixtures(sent_to, drain_queue):
    Notifications.send(id="f", payload={"num": 7})
    sent_to(Notifications, count=1, id="f")
    assert [o.outcome for o in drain_queue(Notifications, expect=1)] == ["acked"]


# --- move time forward ---------------------------------------------------------------------------
@pytest.mark.django_db
def test_a_retry_runs_again_once_its_time_has_come():
    if not clock_is_movable(Notifications):
        pytest.skip("native queues take time from Spanner")
    with moved_clock() as clock:
        Notifications.send(id="later", payload={"num": 2}, delay=timedelta(hours=1))
        assert drain(Notifications) == []  # not due yet
        clock.advance(timedelta(hours=1))
        assert [o.message.key for o in drain(Notifications).acked] == [("later",)]


@pytest.mark.django_db
def test_the_queue_clock_fixture_moves_leases_too(queue_clock):
    from spanner_queues import api

    Notifications.send(id="leased", payload={"num": 3})
    [first] = api.receive(Notifications)  # leased, then "the worker died"
    assert drain(Notifications) == []  # still leased
    queue_clock.advance(timedelta(minutes=10))  # the lease has expired (and its back-off)
    [outcome] = drain(Notifications)
    assert outcome.outcome == "acked" and outcome.message.attempt == first.attempt + 1


@pytest.mark.django_db(transaction=True)
def test_a_worker_started_inside_the_block_follows_the_clock():
    if not clock_is_movable(Notifications):
        pytest.skip("native queues take time from Spanner")
    from spanner_queues.worker import Worker

    with moved_clock() as clock:
        Notifications.send(id="tomorrow", payload={"num": 8}, delay=timedelta(days=1))
        clock.advance(timedelta(days=1))
        worker = Worker(["tasksapp.Notifications"], burst=True, install_signal_handlers=False)
        ran = []
        thread = threading.Thread(target=lambda: ran.append(worker.run()))
        thread.start()
        thread.join(120)
    assert ran and ran[0].processed == 1
    assert Thing.objects.filter(num=8, note="notified").exists()


@pytest.mark.engine_independent
def test_code_loaded_or_run_anywhere_inside_the_block_reads_the_moved_time():
    """Read in a thread started in the block, by ``now`` imported by name, and by a module of
    the package loaded for the first time inside the block (a fresh copy of ``patterns``)."""
    if not clock_is_movable():
        pytest.skip("native queues take time from Spanner")
    name = "spanner_queues._patterns_loaded_late"
    read: dict[str, datetime] = {}

    def in_a_thread() -> None:
        from spanner_queues.clock import now

        spec = importlib.util.spec_from_file_location(name, patterns.__file__)
        late = importlib.util.module_from_spec(spec)
        sys.modules[name] = late
        try:
            spec.loader.exec_module(late)
            read["window"] = late.window_deliver_time(timedelta(days=1))
        finally:
            del sys.modules[name]
        read["now"] = now()

    with moved_clock() as clock:
        clock.advance(timedelta(days=2))
        thread = threading.Thread(target=in_a_thread)
        thread.start()
        thread.join(60)
    real = timezone.now()
    assert read["window"] > real + timedelta(days=1)  # real time would give at most a day
    assert read["now"] > real + timedelta(days=1)


@pytest.mark.engine_independent
def test_moved_clocks_nest():
    if not clock_is_movable():
        pytest.skip("native queues take time from Spanner")
    with moved_clock() as outer:
        outer.advance(timedelta(days=10))
        with moved_clock() as inner:
            inner.advance(timedelta(days=10))
            assert spanner_clock.now() > timezone.now() + timedelta(days=19)
            outer.advance(timedelta(days=10))  # moves the inner clock too
            assert spanner_clock.now() > timezone.now() + timedelta(days=29)
        assert timezone.now() + timedelta(days=19) < spanner_clock.now()
        assert spanner_clock.now() < timezone.now() + timedelta(days=21)
    assert spanner_clock.installed() is None


@pytest.mark.django_db
@pytest.mark.requires("supports_native_queues")
def test_the_clock_cannot_move_native_queues():
    with pytest.raises(ClockNotMovable), moved_clock(Notifications):
        pass


# --- messages sent inside a TestCase transaction -------------------------------------------------
@pytest.mark.unless("supports_native_queues")
class SignupTests(TestCase):
    """One transaction per test, rolled back at the end: nothing commits, and the kit still
    sees what the code under test sent, and drains it, on the test's connection."""

    def test_sent_inside_the_test_transaction(self):
        Notifications.send(id="tc", payload={"num": 4})
        assert_sent(Notifications, id="tc", num=4)
        [outcome] = drain(Notifications)
        self.assertEqual(outcome.outcome, "acked")
        self.assertTrue(Thing.objects.filter(num=4, note="notified").exists())
        self.assertEqual(sent(Notifications), [])

    def test_the_clock_moves_inside_the_test_transaction(self):
        with moved_clock() as clock:
            Notifications.send(id="tc-later", payload={"num": 9}, delay=timedelta(hours=2))
            self.assertEqual(drain(Notifications), [])
            clock.advance(timedelta(hours=2))
            [outcome] = drain(Notifications)
        self.assertEqual(outcome.outcome, "acked")
        self.assertTrue(Thing.objects.filter(num=9, note="notified").exists())


# --- tasks (docs/howto/tasks.md) -----------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_drain_runs_tasks_in_the_test():
    from spanner_queues.contrib.tasks import TaskMessage
    from tests.tasksapp.tasks import fail_after_write, make_thing

    result = make_thing.enqueue(num=5)
    failing = fail_after_write.enqueue(6)
    outcomes = drain("spanner_queues_tasks.TaskMessage", expect=2)
    # a failed task is reported failed, as the worker does; it is acked: not run again
    assert [o.message.key for o in outcomes.acked] == [(result.id,)]
    assert [o.message.key for o in outcomes.failed] == [(failing.id,)]
    assert isinstance(outcomes.failed[0].error, ValueError)
    assert not TaskMessage.objects.exists()
    result.refresh()
    failing.refresh()
    assert result.status == "SUCCESSFUL" and result.return_value == 5
    assert failing.status == "FAILED" and failing.errors[0].exception_class is ValueError
    assert list(Thing.objects.values_list("num", flat=True)) == [5]

"""Pause and resume a queue for every worker: ``api.pause``/``api.resume``/``api.is_paused``,
``manage.py pausequeue``/``resumequeue``, and the worker obeying them."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from spanner_queues import api
from spanner_queues.controls import PausedQueue
from spanner_queues.worker import WorkerEvents
from tests.conftest import wait_until
from tests.worker.conftest import running
from tests.workerapp.models import Events, WorkItems, WorkLog

pytestmark = pytest.mark.django_db(transaction=True)


def test_pause_is_persisted_and_resume_undoes_it() -> None:
    assert not api.is_paused(WorkItems)
    assert api.pause(WorkItems, reason="maintenance") is True
    assert api.pause("workerapp.WorkItems") is False  # already paused, by label too
    assert api.is_paused("workerapp.workitems")
    [row] = PausedQueue.objects.all()
    assert (row.queue, row.reason) == ("workerapp.WorkItems", "maintenance")
    assert not api.is_paused(Events)  # one queue only
    assert api.resume(WorkItems) is True
    assert api.resume(WorkItems) is False
    assert not api.is_paused(WorkItems) and not PausedQueue.objects.exists()


def test_sends_are_accepted_while_paused() -> None:
    api.pause(WorkItems)
    WorkItems.send(id="kept", payload={})
    assert list(WorkItems.objects.values_list("id", flat=True)) == ["kept"]


def test_the_commands_pause_list_and_resume() -> None:
    out = StringIO()
    call_command("pausequeue", "workerapp.WorkItems", reason="deploy", stdout=out)
    call_command("pausequeue", "workerapp.WorkItems", stdout=out)
    call_command("pausequeue", list=True, stdout=out)
    call_command("resumequeue", "workerapp.WorkItems", "workerapp.Events", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "workerapp.WorkItems: paused"
    assert lines[1] == "workerapp.WorkItems: already paused"
    assert lines[2].startswith("workerapp.WorkItems paused at ") and lines[2].endswith(": deploy")
    assert lines[3:] == ["workerapp.WorkItems: resumed", "workerapp.Events: was not paused"]
    with pytest.raises(CommandError, match="No queue named 'nope'"):
        call_command("pausequeue", "nope")
    with pytest.raises(CommandError, match="Name the queues"):
        call_command("pausequeue")


def test_a_worker_receives_nothing_from_a_paused_queue_and_resumes_by_itself(
    make_worker, events: WorkerEvents
) -> None:
    api.pause(WorkItems)
    WorkItems.send(id="held", payload={})
    Events.send(id="other", payload={"type": "note"})
    with running(make_worker(WorkItems, Events)):
        # the other queue runs; the paused one is left alone round after round
        wait_until(lambda: not Events.objects.exists())
        idle = events.counts["idle"]
        wait_until(lambda: events.counts["idle"] >= idle + 5)
        assert [m.key for m in events.messages("received")] == [("other",)]
        assert list(WorkItems.objects.values_list("id", flat=True)) == ["held"]
        api.resume(WorkItems)
        wait_until(lambda: not WorkItems.objects.exists())
    assert WorkLog.objects.filter(key="held").exists()


def test_a_burst_worker_leaves_a_paused_queue_alone(make_worker) -> None:
    api.pause(WorkItems)
    WorkItems.send(id="held", payload={})
    stats = make_worker(WorkItems, burst=True).run()
    assert stats.received == 0
    assert WorkItems.objects.filter(id="held").exists()

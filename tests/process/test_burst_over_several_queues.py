"""``runqueueworker --burst`` serving several queues, as real child processes: it exits only
once no queue it serves has a due message (a round that only took what a native stream held
at that moment proves nothing), and it exits when all that is left is work no receiver of
this release matches (given back, due again after its back-off) or work not yet due, saying
so."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.children import Start
from tests.workerapp.models import Jobs, Tasks, WorkItems, WorkLog

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

#: nine queues with receivers: those of ``tests.workerapp`` but ``Ticks`` (a 0.5 s periodic
#: schedule falls due again and again: a burst worker serving it runs its ticks as they fall
#: due), and the task queues of ``tests.tasksapp``
QUEUES = (
    "workerapp.WorkItems",
    "tasksapp.EmailTasks",
    "tasksapp.Notifications",
    "workerapp.Tasks",
    "workerapp.Events",
    "workerapp.Dirty",
    "workerapp.Pings",
    "workerapp.Jobs",
    "workerapp.Limited",
)


def test_a_burst_worker_over_several_queues_drains_a_backlog_on_one_of_them(
    children: Start,
) -> None:
    sent = WorkItems.send_many([{"payload": {}} for _ in range(25)])
    child = children(*QUEUES, "--burst", "-v1")
    assert child.wait() == 0, child.output()
    assert sorted(WorkLog.objects.values_list("key", flat=True)) == sorted(m.key[0] for m in sent)
    assert not WorkItems.objects.exists()
    assert "processed=25" in child.output()


def test_two_burst_workers_over_several_queues_drain_a_backlog_between_them(
    children: Start,
) -> None:
    sent = WorkItems.send_many([{"payload": {}} for _ in range(60)])
    sent += Tasks.send_many([{"kind": "email", "payload": ""} for _ in range(20)])
    workers = [children(*QUEUES, "--burst", name=f"b{i}") for i in range(2)]
    for child in workers:
        assert child.wait() == 0, child.output()
    committed = Counter(WorkLog.objects.values_list("key", flat=True))
    outputs = "\n".join(child.output() for child in workers)
    assert sorted(committed) == sorted(m.key[-1] for m in sent), outputs
    assert set(committed.values()) == {1}, outputs
    assert not WorkItems.objects.exists() and not Tasks.objects.exists()


def test_a_burst_worker_exits_when_only_unmatched_work_is_left_and_says_so(
    children: Start,
) -> None:
    Jobs.send(kind="email", id="known")
    Jobs.send(kind="refund", id="unknown")  # no receiver of this release matches it
    child = children("workerapp.Jobs", "workerapp.WorkItems", "--burst", "-v1")
    assert child.wait() == 0, child.output()
    assert list(WorkLog.objects.values_list("key", flat=True)) == ["known"]
    assert list(Jobs.objects.values_list("id", flat=True)) == ["unknown"]  # given back
    assert "no receiver of this worker matches" in child.output()
    assert "left to a worker that has its receiver" in child.output()


def test_a_burst_worker_on_one_queue_exits_when_only_unmatched_work_is_left(
    children: Start,
) -> None:
    Jobs.send(kind="refund", id="unknown")
    child = children("workerapp.Jobs", "--burst", "-v1")
    assert child.wait() == 0, child.output()
    assert list(Jobs.objects.values_list("id", flat=True)) == ["unknown"]
    assert not WorkLog.objects.exists()

"""The Tasks runner in the worker's groups: several tasks' writes, results and acks commit in
one transaction (on databases with savepoints); a task that fails in the group rolls back its
own writes only, and its FAILED result commits with the others."""

from __future__ import annotations

import pytest
from django.db import transaction

from spanner_queues.contrib.tasks.framework import TaskResultStatus
from spanner_queues.drivers import driver_for
from tests.tasksapp.models import Thing
from tests.tasksapp.tasks import fail_after_write, make_thing

pytestmark = pytest.mark.django_db(transaction=True)


def test_several_tasks_commit_at_once_and_a_failed_one_rolls_back_alone(run_worker) -> None:
    if not driver_for("default").has_savepoints:
        pytest.skip("no savepoints: each task runs alone")
    with transaction.atomic():
        results = [make_thing.enqueue(i) for i in range(8)]
        failed = fail_after_write.enqueue(100)

    def finished() -> bool:
        for r in [*results, failed]:
            r.refresh()
        return all(r.is_finished for r in [*results, failed])

    events = run_worker(finished, options={"prefetch": 20})
    assert [r.status for r in results] == [TaskResultStatus.SUCCESSFUL] * 8
    assert failed.status == TaskResultStatus.FAILED
    assert sorted(Thing.objects.values_list("num", flat=True)) == list(range(8))
    stats = events.history[-1].stats
    assert stats is not None and stats.groups < stats.grouped  # shared commits

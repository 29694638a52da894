"""The Tasks runner in the worker's groups: several tasks' writes, results and acks commit in
one transaction (on databases with savepoints); a task that fails in the group rolls back its
own writes only, and its FAILED result commits with the others."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from spanner_queues.contrib.tasks.framework import TaskResultStatus
from spanner_queues.contrib.tasks.models import TaskMessage, TaskResultRecord
from spanner_queues.drivers import driver_for
from tests.statements import statements_matching
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


def _group_of_eight(
    run_worker: Any, verb: str, table: str
) -> tuple[list[Any], Any, list[tuple[str, bool]]]:
    """Eight grouped tasks run by a worker; their results, its stats and the statements of
    ``verb`` (``DELETE``, ``INSERT``) on ``table`` it sent, each ``(sql, many)``."""
    if not driver_for("default").has_savepoints:
        pytest.skip("no savepoints: each task runs alone")
    with transaction.atomic():
        results = [make_thing.enqueue(i) for i in range(8)]

    def finished() -> bool:
        for r in results:
            r.refresh()
        return all(r.is_finished for r in results)

    with statements_matching(
        lambda sql: sql.lstrip().upper().startswith(verb) and table in sql
    ) as statements:
        events = run_worker(finished, options={"prefetch": 20, "group_ms": 10_000})
    assert [r.status for r in results] == [TaskResultStatus.SUCCESSFUL] * 8
    stats = events.history[-1].stats
    assert stats is not None and stats.grouped >= 8, stats
    return results, stats, statements


def test_tasks_of_a_group_are_acked_in_one_statement(run_worker) -> None:
    """The Tasks runner leaves the ack of a grouped task to the worker (it acks in the
    transaction the result is written in): one DELETE of the task queue for the group, not
    one a task."""
    _, stats, deletes = _group_of_eight(run_worker, "DELETE", TaskMessage._meta.db_table)
    assert sorted(Thing.objects.values_list("num", flat=True)) == list(range(8))
    assert len(deletes) <= stats.groups, deletes


def test_results_of_a_group_are_inserted_in_one_statement(run_worker) -> None:
    """A grouped task's result row is handed to the group, which inserts its tasks' rows in
    one statement before its ack: one INSERT of the result table for a group, not one a
    task."""
    results, stats, inserts = _group_of_eight(run_worker, "INSERT", TaskResultRecord._meta.db_table)
    assert [r.return_value for r in results] == list(range(8))
    assert len(inserts) <= stats.groups, inserts
    # where executemany is one round trip (psycopg 3's pipeline), a group's rows go as one
    # executemany of the one-row INSERT (whose placeholders the driver parses once), not as
    # one INSERT of many rows
    pipelined = driver_for("default").pipelines_executemany
    assert all(many == pipelined for sql, many in inserts if sql.count("%s") > 19), inserts
    assert any(many for _sql, many in inserts) == pipelined, inserts

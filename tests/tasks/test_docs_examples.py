"""The examples of Django's Tasks documentation (the django-tasks backport's usage guide),
unchanged, against spanner_queues.tasks.QueueBackend, run by the worker."""

from __future__ import annotations

import pytest
from django_tasks import TaskResultStatus, default_task_backend
from django_tasks.exceptions import InvalidTaskError

from tests.tasks import docs_context
from tests.tasks.docs_examples import (
    calculate_meaning_of_life,
    create_and_enqueue_on_commit,
    process_thing,
    raise_value_error,
)
from tests.tasksapp.models import Thing

pytestmark = pytest.mark.django_db(transaction=True)


def test_enqueue_get_result_return_value_and_refresh(run_worker) -> None:
    result = calculate_meaning_of_life.enqueue()

    result_id = result.id
    # Later, somewhere else...
    assert calculate_meaning_of_life.get_result(result_id).id == result_id
    assert default_task_backend.get_result(result_id).id == result_id

    assert result.status == TaskResultStatus.READY
    run_worker(lambda: calculate_meaning_of_life.get_result(result_id).is_finished)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42
    assert result.attempts == 1
    assert result.last_attempted_at is not None


def test_task_context(run_worker) -> None:
    result = docs_context.calculate_meaning_of_life.enqueue()
    run_worker(lambda: default_task_backend.get_result(result.id).is_finished)
    result.refresh()
    assert result.return_value == 42


def test_errors(run_worker) -> None:
    result = raise_value_error.enqueue()
    run_worker(lambda: default_task_backend.get_result(result.id).is_finished)
    result.refresh()
    assert result.errors[0].exception_class == ValueError  # noqa: E721  (the docs, unchanged)
    assert isinstance(result.errors[0].traceback, str)


def test_on_commit_enqueue_of_djangos_docs_still_works(run_worker) -> None:
    create_and_enqueue_on_commit()
    from spanner_queues.tasks.models import TaskResultRecord

    record = TaskResultRecord.objects.get(task_path=process_thing.module_path)
    run_worker(lambda: default_task_backend.get_result(record.id).is_finished)
    assert default_task_backend.get_result(record.id).return_value == 1
    assert Thing.objects.count() == 1


def test_backend_introspection() -> None:
    assert default_task_backend.supports_get_result


def test_priority_example_is_refused_with_the_frameworks_error() -> None:
    """``.using(priority=10)``: queues cannot order by priority, so the backend says
    ``supports_priority = False`` and the framework refuses it."""
    with pytest.raises(InvalidTaskError):
        calculate_meaning_of_life.using(priority=10)

"""``@task(...)``'s options of this backend (``QueueTask``): ``max_attempts``, ``retry_delay``,
``timeout``; unknown ones refused. Django 6.1 and the django-tasks backport hand ``@task``'s
extra keywords to the backend's ``task_class``; Django 6.0 refuses them itself."""

from __future__ import annotations

from datetime import timedelta

import django
import pytest
from django.utils import timezone

from spanner_queues.contrib.tasks.backend import QueueTask
from spanner_queues.contrib.tasks.framework import InvalidTask, TaskResultStatus, task
from spanner_queues.contrib.tasks.models import TaskMessage
from spanner_queues.exceptions import TimeLimitExceeded

OPTIONS_REACH_THE_BACKEND = django.VERSION[:2] != (6, 0)
pytestmark = pytest.mark.django_db(transaction=True)
needs_options = pytest.mark.skipif(
    not OPTIONS_REACH_THE_BACKEND, reason="Django 6.0's @task takes no backend options"
)


def finished(*results):
    def check() -> bool:
        for r in results:
            r.refresh()
        return all(r.is_finished for r in results)

    return check


def undecorated(name: str) -> None:  # (module level, as the framework requires)
    return None


@pytest.mark.skipif(OPTIONS_REACH_THE_BACKEND, reason="Django 6.0 only")
def test_on_django_6_0_task_takes_no_options_and_tasks_keep_the_defaults() -> None:
    with pytest.raises(TypeError):
        task(max_attempts=3)(undecorated)
    plain = task()(undecorated)
    assert isinstance(plain, QueueTask) and (plain.max_attempts, plain.timeout) == (1, None)


@needs_options
def test_the_options_are_this_backends_and_unknown_ones_are_refused_clearly() -> None:
    made = task(max_attempts=3, retry_delay=timedelta(seconds=2), timeout=5)(undecorated)
    assert isinstance(made, QueueTask)
    assert (made.max_attempts, made.retry_delay, made.timeout) == (3, timedelta(seconds=2), 5)
    assert made.using(queue_name="emails").max_attempts == 3  # kept by .using()
    with pytest.raises(InvalidTask, match=r"'retries'.*max_attempts, retry_delay, timeout"):
        task(retries=3)(undecorated)
    for wrong in ({"max_attempts": 0}, {"max_attempts": 1.5}, {"max_attempts": True}):
        with pytest.raises(InvalidTask, match="max_attempts"):
            task(**wrong)(undecorated)
    with pytest.raises(InvalidTask, match="retry_delay"):
        task(retry_delay=-1)(undecorated)
    with pytest.raises(InvalidTask, match="timeout"):
        task(timeout=0)(undecorated)


@needs_options
def test_a_task_failing_every_run_runs_max_attempts_times_then_fails_with_each_error(
    run_worker,
) -> None:
    from tests.tasks import option_tasks

    result = option_tasks.always_fails.enqueue("a")
    events = run_worker(finished(result))
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [ValueError] * 3
    assert "run 3 of a failed" in result.errors[2].traceback
    assert result.attempts == 3 and option_tasks.runs["a"] == 3
    assert events.counts["failed"] == 3  # each failed run logged and counted
    assert not TaskMessage.objects.exists()


@needs_options
def test_a_task_failing_once_succeeds_on_its_next_run_with_the_error_kept(run_worker) -> None:
    from tests.tasks import option_tasks

    result = option_tasks.fails_once.enqueue("b")
    run_worker(finished(result))
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 2
    assert [e.exception_class for e in result.errors] == [ValueError]
    assert result.attempts == 2


@needs_options
def test_after_a_failed_run_the_task_is_ready_again_after_its_retry_delay(run_worker) -> None:
    from tests.tasks import option_tasks

    result = option_tasks.fails_then_waits.enqueue("c")
    events = run_worker(
        lambda: option_tasks.runs.get("c") == 1 and result.refresh() is None and result.errors
    )
    assert result.status == TaskResultStatus.READY and len(result.errors) == 1
    # its first run's: the worker's own id, as its log lines and events name it
    [worker_id] = {e.worker_id for e in events.history}
    assert result.worker_ids == [worker_id] and result.attempts == 1
    message = TaskMessage.objects.get(id=result.id)
    assert message.deliver_time >= timezone.now() + timedelta(minutes=59)


@needs_options
def test_a_tasks_own_timeout_ends_it_failed_without_a_worker_timeout(run_worker) -> None:
    from tests.tasks import option_tasks

    result = option_tasks.overruns.enqueue(120)
    events = run_worker(finished(result), options={"timeout": None})
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TimeLimitExceeded
    assert events.counts["timed_out"] == 1


@needs_options
def test_unique_for_enqueues_the_same_arguments_once_per_window(run_worker) -> None:
    from django.db import transaction

    from spanner_queues.contrib.tasks import was_dropped
    from spanner_queues.uniqueness import SentKey
    from tests.tasks import option_tasks

    first = option_tasks.daily_digest.enqueue(1)
    assert not was_dropped(first)
    run_worker(finished(first))  # handled: the window still holds
    again = option_tasks.daily_digest.enqueue(1)
    assert was_dropped(again) and not TaskMessage.objects.exists()
    other = option_tasks.daily_digest.enqueue(2)
    assert not was_dropped(other) and TaskMessage.objects.count() == 1
    with pytest.raises(RuntimeError), transaction.atomic():
        option_tasks.daily_digest.enqueue(3)
        raise RuntimeError("boom")
    assert SentKey.objects.count() == 2  # the rolled-back enqueue left no claim
    with pytest.raises(InvalidTask, match="unique_for must be a positive timedelta"):
        task(unique_for=timedelta(0))(undecorated)

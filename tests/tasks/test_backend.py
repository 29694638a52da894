"""spanner_queues.contrib.tasks.QueueBackend: transactional enqueue, results, and worker runs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from spanner_queues.contrib.tasks import QueueBackend
from spanner_queues.contrib.tasks.framework import (
    FRAMEWORK_APP,
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    default_task_backend,
    task_backends,
)
from spanner_queues.contrib.tasks.models import TaskMessage, TaskResultRecord
from spanner_queues.contrib.tasks.runner import RECEIVER_NAME
from spanner_queues.receivers import receivers
from tests.tasksapp import tasks
from tests.tasksapp.models import EmailTasks, Thing

pytestmark = pytest.mark.django_db(transaction=True)


def finished_record(status: str, *, finished_at, **fields) -> TaskResultRecord:
    """A stored result row (as the worker writes them)."""
    from spanner_queues.contrib.tasks.framework import get_random_id

    values = {
        "task_path": tasks.add.module_path,
        "backend": "default",
        "queue_name": "default",
        "queue": TaskMessage._meta.label,
        "enqueued_at": timezone.now(),
        "args_json": "[1, 1]",
        **fields,
    }
    return TaskResultRecord.objects.create(
        id=get_random_id(), status=status, finished_at=finished_at, **values
    )


def finished(*results):
    def check() -> bool:
        for r in results:
            r.refresh()
        return all(r.is_finished for r in results)

    return check


def test_backend_is_configured_with_honest_flags() -> None:
    assert isinstance(task_backends["default"], QueueBackend)
    assert default_task_backend.supports_defer
    assert default_task_backend.supports_get_result
    assert default_task_backend.supports_async_task
    assert not default_task_backend.supports_priority


def test_the_task_queues_have_the_task_receiver() -> None:
    for queue in (TaskMessage, EmailTasks):
        assert [s.name for s in receivers.for_queue(queue)] == [RECEIVER_NAME]


def test_validation_errors_are_the_frameworks_own() -> None:
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=10)
    with pytest.raises(InvalidTask, match="not valid"):
        tasks.add.using(queue_name="nowhere")
    with pytest.raises(InvalidTask, match="aware"):
        tasks.add.using(run_after=timezone.now().replace(tzinfo=None))


def test_enqueue_rolled_back_with_the_callers_transaction_leaves_nothing() -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        Thing.objects.create(num=1)
        result = tasks.add.enqueue(1, 2)
        assert TaskMessage.objects.filter(id=result.id).exists()  # same connection: visible
        raise Boom
    assert not Thing.objects.exists()
    assert not TaskMessage.objects.exists()
    assert not TaskResultRecord.objects.exists()
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result.id)


def test_enqueue_commits_with_the_caller_and_the_worker_runs_it(run_worker) -> None:
    with transaction.atomic():
        Thing.objects.create(num=1)
        result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    stored = tasks.add.get_result(result.id)
    assert stored.status == TaskResultStatus.READY and stored.args == [2, 3]
    run_worker(finished(result))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1 and len(result.worker_ids) == 1
    assert result.started_at and result.finished_at and result.last_attempted_at
    assert not TaskMessage.objects.exists()  # acked


def test_task_writes_commit_with_its_success(run_worker) -> None:
    result = tasks.make_thing.enqueue(num=7)
    run_worker(finished(result))
    assert result.return_value == 7
    assert list(Thing.objects.values_list("num", flat=True)) == [7]


def test_failure_is_failed_with_traceback_and_its_writes_rolled_back(run_worker) -> None:
    result = tasks.fail_after_write.enqueue(4)
    run_worker(finished(result))
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is ValueError
    assert "no thing 4" in result.errors[0].traceback
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018
    assert not Thing.objects.exists()
    assert not TaskMessage.objects.exists()  # acked: a failed task is not run again


def test_a_return_value_that_is_not_json_fails_the_task(run_worker) -> None:
    result = tasks.returns_object.enqueue()
    run_worker(finished(result))
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError


def test_async_task(run_worker) -> None:
    Thing.objects.create(num=1)
    result = tasks.async_add.enqueue(1, 2)
    run_worker(finished(result))
    assert result.return_value == 4


def test_takes_context_gets_the_attempt_and_result(run_worker) -> None:
    result = tasks.attempt_and_id.enqueue()
    run_worker(finished(result))
    assert result.return_value == {"attempt": 1, "id": result.id}


def test_queue_name_goes_to_its_own_queue_model(run_worker) -> None:
    result = tasks.send_email.enqueue("a@example.com")
    assert EmailTasks.objects.filter(id=result.id).exists()
    assert not TaskMessage.objects.exists()
    run_worker(finished(result))
    assert result.return_value == "sent to a@example.com"


def test_run_after_is_the_deliver_time(run_worker) -> None:
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    now = tasks.add.enqueue(2, 2)
    message = TaskMessage.objects.get(id=later.id)
    assert message.deliver_time >= timezone.now() + timedelta(minutes=59)
    events = run_worker(finished(now))
    acked = [m.key for m in events.messages("acked") if m.queue == TaskMessage._meta.label]
    assert acked == [(now.id,)]
    later.refresh()
    assert later.status == TaskResultStatus.READY
    assert TaskMessage.objects.filter(id=later.id).exists()


def test_aenqueue_and_aget_result() -> None:
    async def scenario() -> None:
        result = await tasks.add.aenqueue(1, 2)
        fetched = await tasks.add.aget_result(result.id)
        assert fetched.status == TaskResultStatus.READY and fetched.args == [1, 2]
        await result.arefresh()
        assert result.status == TaskResultStatus.READY

    async_to_sync(scenario)()


def test_retention_prunes_finished_results_only(settings) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "spanner_queues.contrib.tasks.QueueBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {
                "QUEUE_MODELS": {"emails": "tasksapp.EmailTasks"},
                "RESULT_RETENTION_SECONDS": 3600,
            },
        }
    }
    backend = task_backends["default"]
    hours_ago = timezone.now() - timedelta(hours=2)
    finished_record("SUCCESSFUL", finished_at=hours_ago)
    finished_record("FAILED", finished_at=hours_ago)
    recent = finished_record("SUCCESSFUL", finished_at=timezone.now())
    running = finished_record("RUNNING", finished_at=None)  # (native queues write RUNNING)
    waiting = tasks.add.enqueue(2, 2)
    assert backend.prune_results() == 2
    assert set(TaskResultRecord.objects.values_list("id", flat=True)) == {recent.id, running.id}
    assert TaskMessage.objects.filter(id=waiting.id).exists()  # untouched by pruning


def test_check_refuses_a_queue_model_that_cannot_carry_tasks() -> None:
    backend = QueueBackend(
        "checked",
        {"OPTIONS": {"QUEUE_MODELS": {"a": "testapp.Greetings", "b": "nowhere.Queue"}}},
    )
    errors = list(backend.check())
    assert [e.id for e in errors] == ["spanner_queues.E102", "spanner_queues.E102"]
    assert "Greetings" in errors[0].msg and "nowhere" in errors[1].msg
    assert list(task_backends["default"].check()) == []


@pytest.mark.skipif(FRAMEWORK_APP is None, reason="Django 6: django.tasks is not an app")
def test_check_asks_for_django_tasks_in_installed_apps_on_django_5_2(monkeypatch) -> None:
    from django.apps import apps

    monkeypatch.setattr(apps, "is_installed", lambda name: name != "django_tasks")
    assert [e.id for e in task_backends["default"].check()] == ["spanner_queues.E101"]


@pytest.mark.skipif(FRAMEWORK_APP is not None, reason="Django 5.2: the backport is an app")
def test_on_django_6_the_backend_runs_on_django_tasks_without_the_backport() -> None:
    import importlib.util

    import django.tasks

    assert importlib.util.find_spec("django_tasks") is None  # (not installed on this line)
    assert isinstance(task_backends["default"], django.tasks.backends.base.BaseTaskBackend)
    assert task_backends is django.tasks.task_backends
    assert list(task_backends["default"].check()) == []


def test_non_atomic_tasks_keep_their_writes_when_they_fail(settings, run_worker) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "spanner_queues.contrib.tasks.QueueBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"QUEUE_MODELS": {"emails": "tasksapp.EmailTasks"}, "ATOMIC_TASKS": False},
        }
    }
    assert task_backends["default"].atomic_tasks is False
    failing = tasks.fail_after_write.enqueue(8)
    working = tasks.make_thing.enqueue(num=9)
    run_worker(finished(failing, working))
    assert failing.status == TaskResultStatus.FAILED
    assert working.status == TaskResultStatus.SUCCESSFUL
    assert sorted(Thing.objects.values_list("num", flat=True)) == [8, 9]  # committed as made


def test_a_task_is_one_message_until_it_finishes_then_one_result_row(run_worker) -> None:
    result = tasks.add.enqueue(1, 2)
    assert TaskMessage.objects.filter(id=result.id).exists()
    assert not TaskResultRecord.objects.exists()  # written when the task finishes
    run_worker(finished(result))
    record = TaskResultRecord.objects.get(id=result.id)
    assert (record.status, record.return_value, record.args) == ("SUCCESSFUL", 3, [1, 2])
    assert record.task_path == tasks.add.module_path and record.queue == TaskMessage._meta.label
    assert not TaskMessage.objects.exists()


def test_a_task_shows_running_while_a_worker_holds_its_message() -> None:
    from spanner_queues.api import receive

    result = tasks.add.enqueue(1, 2)
    from spanner_queues.engines import engine_for

    [message] = receive(TaskMessage)  # a worker's claim: the task's lease
    if not engine_for(TaskMessage).features.stores_bookkeeping_fields:
        # native queues show no lease on a row: RUNNING is the row the task's start commits
        assert tasks.add.get_result(result.id).status == TaskResultStatus.READY
        return
    assert tasks.add.get_result(result.id).status == TaskResultStatus.RUNNING
    assert tasks.add.get_result(result.id).attempts == 1
    from spanner_queues.api import release

    release(message)
    assert tasks.add.get_result(result.id).status == TaskResultStatus.READY


def test_a_message_of_an_earlier_release_runs_on_its_result_row(run_worker) -> None:
    # (releases before one-row storage wrote the row at enqueue, and a message of three keys)
    from spanner_queues import api

    record = finished_record("READY", finished_at=None, task_path=tasks.make_thing.module_path)
    record.args_json, record.kwargs_json = "[]", '{"num": 10}'
    record.save()
    gone = finished_record("READY", finished_at=None, task_path=tasks.make_thing.module_path)
    gone_id = gone.id
    gone.delete()  # its row deleted by hand: acked without running
    for result_id in (record.id, gone_id):
        payload = {"id": result_id, "task": record.task_path, "backend": "default"}
        api.send(TaskMessage, payload=payload, id=result_id)
    events = run_worker(lambda: not TaskMessage.objects.exists())
    assert list(Thing.objects.values_list("num", flat=True)) == [10]
    assert TaskResultRecord.objects.get(id=record.id).status == "SUCCESSFUL"
    assert not events.messages("already_acked") and not events.messages("failed")


def test_signals_and_worker_side_retention(settings, run_worker) -> None:
    from spanner_queues.contrib.tasks.framework import task_finished, task_started

    seen: list[tuple[str, str]] = []

    def listen(sender, task_result, **kwargs) -> None:
        seen.append((task_result.id, task_result.status))

    settings.TASKS = {
        "default": {
            "BACKEND": "spanner_queues.contrib.tasks.QueueBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {
                "QUEUE_MODELS": {"emails": "tasksapp.EmailTasks"},
                "RESULT_RETENTION_SECONDS": 3600,
            },
        }
    }
    old = finished_record("SUCCESSFUL", finished_at=timezone.now() - timedelta(hours=2))
    task_started.connect(listen)
    task_finished.connect(listen)
    try:
        new = tasks.add.enqueue(2, 2)
        run_worker(lambda: not TaskResultRecord.objects.filter(id=old.id).exists())
    finally:
        task_started.disconnect(listen)
        task_finished.disconnect(listen)
    assert seen == [(new.id, TaskResultStatus.RUNNING), (new.id, TaskResultStatus.SUCCESSFUL)]
    new.refresh()
    assert new.return_value == 4  # kept: not past its retention


def test_admin_lists_results_read_only_with_filters(client, django_user_model) -> None:
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    result = finished_record("SUCCESSFUL", finished_at=timezone.now())
    url = "/admin/spanner_queues_tasks/taskresultrecord/"
    page = client.get(url, {"status__exact": "SUCCESSFUL"})
    assert page.status_code == 200 and result.id in page.content.decode()
    assert result.id not in client.get(url, {"status__exact": "FAILED"}).content.decode()
    assert client.get(url + "add/").status_code == 403
    detail = client.get(f"{url}{result.id}/change/")
    assert detail.status_code == 200 and b"Save" not in detail.content


def _reads(work) -> int:
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from spanner_queues.engines import engine_for

    with CaptureQueriesContext(connections[engine_for(TaskMessage).database]) as queries:
        work()
    return len(queries)


def test_get_result_of_an_unknown_id_reads_the_result_rows_alone() -> None:
    """Not every queue model of the backend (two here): a new id names its queue."""
    from spanner_queues.contrib.tasks.backend import queue_tag

    def unknown(result_id: str):
        def read() -> None:
            with pytest.raises(TaskResultDoesNotExist):
                default_task_backend.get_result(result_id)

        return read

    assert len(default_task_backend.all_queue_models()) == 2
    assert _reads(unknown("nope")) == 1
    assert _reads(unknown(f"{'x' * 32}-{queue_tag(EmailTasks)}")) == 3  # its queue, twice its row
    result = tasks.add.enqueue(1, 2)
    assert result.id.endswith(f"-{queue_tag(TaskMessage)}")
    assert _reads(lambda: default_task_backend.get_result(result.id)) == 2  # row, then queue


def test_a_task_enqueued_by_release_0_1_0_is_found_in_its_queue(monkeypatch) -> None:
    """Its id names no queue (the framework's 32 characters): every queue is read."""
    from spanner_queues.contrib.tasks import backend
    from spanner_queues.contrib.tasks.framework import get_random_id

    monkeypatch.setattr(backend, "new_result_id", lambda model: get_random_id())
    result = tasks.add.enqueue(1, 2)
    assert len(result.id) == 32
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.READY


def test_admin_shows_a_tasks_errors_as_preformatted_tracebacks(client, django_user_model) -> None:
    """Not the stored JSON with literal ``\\n``: each error's class and traceback, its lines
    broken as Python printed them, escaped."""
    import json

    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: <b>no</b>\n'
    errors = [{"exception_class_path": "builtins.ValueError", "traceback": traceback}]
    result = finished_record("FAILED", finished_at=timezone.now(), errors_json=json.dumps(errors))
    page = client.get(f"/admin/spanner_queues_tasks/taskresultrecord/{result.id}/change/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "\\n" not in html.split("builtins.ValueError", 1)[1].split("</pre>", 1)[0]
    assert (
        "<pre>builtins.ValueError\nTraceback (most recent call last):\n"
        "  File &quot;x.py&quot;, line 1\nValueError: &lt;b&gt;no&lt;/b&gt;\n</pre>"
    ) in html

"""Failed tasks are visible (the traceback in the log, counted as failed by the worker and its
metrics), tasks raising BaseExceptions or whose function is gone end FAILED, and the worker
lives on."""

from __future__ import annotations

import logging

import pytest

from spanner_queues.contrib.tasks.framework import (
    LOGGER,
    InvalidTask,
    TaskResultStatus,
    default_task_backend,
    get_module_path,
)
from spanner_queues.contrib.tasks.models import TaskMessage, TaskResultRecord
from tests.tasks import failing_tasks
from tests.tasks.stored import restore_task

pytestmark = pytest.mark.django_db(transaction=True)

Q = TaskMessage._meta.label


def finished(*results):
    def check() -> bool:
        for r in results:
            r.refresh()
        return all(r.is_finished for r in results)

    return check


def summary(events):
    return next(e.stats for e in events.history if e.name == "summary")


def test_a_failed_task_logs_its_traceback_with_task_id_queue_and_attempt(
    run_worker, caplog
) -> None:
    caplog.set_level(logging.INFO)
    result = failing_tasks.raise_value_error.enqueue(1)
    run_worker(finished(result))
    assert result.status == TaskResultStatus.FAILED
    worker_records = [
        r
        for r in caplog.records
        if r.name == "spanner_queues.worker" and r.levelno >= logging.ERROR
    ]
    assert len(worker_records) == 1, [r.getMessage() for r in worker_records]
    record = worker_records[0]
    text = record.getMessage()
    assert result.id in text and Q in text and "attempt 1" in text
    assert record.exc_info and isinstance(record.exc_info[1], ValueError)
    assert "task 1 failed" in caplog.text and "raise_value_error" in caplog.text
    assert (record.queue, record.message_key, record.attempt) == (Q, (result.id,), 1)
    # the framework's own task_finished line is there, without a second copy of the traceback
    # (two failures printed 119 lines), and without "NoneType: None"
    framework = [r for r in caplog.records if r.name == LOGGER and "FAILED" in r.getMessage()]
    assert len(framework) == 1 and result.id in framework[0].getMessage()
    assert [r for r in caplog.records if r.exc_info and r.exc_info[0]] == [record]
    assert caplog.text.count("Traceback (most recent call last)") == 1
    assert "NoneType: None" not in caplog.text


def test_a_task_failing_under_the_test_kits_drain_logs_its_traceback_once(caplog) -> None:
    """``drain`` settles as the worker does: its failure report carries the traceback, the
    framework's line does not repeat it."""
    from spanner_queues.testing import drain

    caplog.set_level(logging.INFO)
    result = failing_tasks.raise_value_error.enqueue(1)
    drain(TaskMessage)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert caplog.text.count("Traceback (most recent call last)") == 1, caplog.text


def test_failed_tasks_count_as_failed_in_the_worker_summary(run_worker) -> None:
    results = [failing_tasks.raise_value_error.enqueue(n) for n in range(3)]
    ok = failing_tasks.add.enqueue(1, 2)
    events = run_worker(finished(*results, ok))
    stats = summary(events)
    assert stats.failed == 3  # (processed: the task that worked, and other queues' messages)
    assert [m.key for m in events.messages("acked") if m.queue == Q] == [(ok.id,)]
    assert sorted(m.key for m in events.messages("failed")) == sorted((r.id,) for r in results)
    assert not events.messages("released")  # acked with FAILED: nothing given back
    assert not TaskMessage.objects.exists()


def test_failed_tasks_are_counted_with_the_failed_outcome_and_acked() -> None:
    from prometheus_client import REGISTRY

    from spanner_queues.contrib import metrics
    from spanner_queues.worker import Worker

    metrics.enable()

    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    outcomes = "spanner_queues_worker_messages_total"
    before = {o: value(outcomes, queue=Q, outcome=o) for o in ("failed", "acked")}
    acks = value("spanner_queues_message_ack_count_total", queue=Q)
    failing_tasks.raise_value_error.enqueue(1)
    failing_tasks.add.enqueue(1, 2)
    Worker(
        [TaskMessage],
        burst=True,
        install_signal_handlers=False,
        listeners=[metrics.WorkerMetrics()],
    ).run()
    assert value(outcomes, queue=Q, outcome="failed") == before["failed"] + 1
    assert value(outcomes, queue=Q, outcome="acked") == before["acked"] + 1
    assert value("spanner_queues_message_ack_count_total", queue=Q) == acks + 2
    # docs/prometheus/alerts.yml's TasksFailing selects this series
    selector = _alert_selector("TasksFailing", outcomes)
    assert selector and _matches(selector)({"queue": Q, "outcome": "failed"})
    assert not _matches(selector)({"queue": Q, "outcome": "acked"})
    assert not _matches(selector)({"queue": "testapp.Jobs", "outcome": "failed"})


def _alert_selector(alert: str, metric: str) -> list[tuple[str, str, str]]:
    """The label matchers of ``metric`` in the expression of ``alert`` in alerts.yml."""
    import re
    from pathlib import Path

    import yaml

    path = Path(__file__).resolve().parents[2] / "docs/prometheus/alerts.yml"
    rules = yaml.safe_load(path.read_text())["groups"][0]["rules"]
    [expr] = [r["expr"] for r in rules if r["alert"] == alert]
    inner = re.search(re.escape(metric) + r"\{([^}]*)\}", expr)
    assert inner, expr
    return [
        (name, op, text.replace("\\\\", "\\"))  # (PromQL strings escape backslashes)
        for name, op, text in re.findall(r'(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"', inner.group(1))
    ]


def _matches(selector: list[tuple[str, str, str]]):
    import re

    def match(labels: dict[str, str]) -> bool:
        for name, op, text in selector:
            got = labels.get(name, "")
            ok = {"=": got == text, "!=": got != text}.get(op)
            if ok is None:
                ok = bool(re.fullmatch(text, got)) == (op == "=~")
            if not ok:
                return False
        return True

    return match


@pytest.mark.parametrize(
    "task, error",
    [
        (failing_tasks.raise_system_exit, SystemExit),
        (failing_tasks.raise_generator_exit, GeneratorExit),
        (failing_tasks.raise_keyboard_interrupt, KeyboardInterrupt),
    ],
)
def test_a_task_raising_a_base_exception_is_failed_and_the_worker_lives_on(
    run_worker, task, error
) -> None:
    result = task.enqueue()
    after = failing_tasks.add.enqueue(2, 3)
    events = run_worker(finished(result, after))  # (fails if the worker crashed)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is error
    assert error.__name__ in result.errors[0].traceback
    assert after.return_value == 5
    assert not events.messages("crashed")
    assert not TaskMessage.objects.exists()


def test_a_task_whose_function_is_gone_is_failed_once_and_acked(run_worker) -> None:
    result = failing_tasks.add.enqueue(1, 1)
    gone = "tests.tasks.failing_tasks.removed_in_this_release"
    restore_task(result.id, task=gone)
    events = run_worker(lambda: not TaskMessage.objects.exists())
    record = TaskResultRecord.objects.get(id=result.id)
    assert record.status == "FAILED"
    assert record.attempts == 1 and len(record.worker_ids) == 1
    [error] = record.errors
    assert error["exception_class_path"] == get_module_path(InvalidTask)
    assert gone in error["traceback"]
    assert [m.key for m in events.messages("failed")] == [(result.id,)]
    assert summary(events).failed == 1
    # get_result() works in a process without the function
    stored = default_task_backend.get_result(result.id)
    assert stored.status == TaskResultStatus.FAILED
    assert stored.task.module_path == gone
    assert stored.errors[0].exception_class is InvalidTask
    with pytest.raises(InvalidTask, match=gone):
        stored.task.call()


def test_a_task_whose_module_raises_on_import_is_failed_once_with_the_error(run_worker) -> None:
    # (issue 30: it stayed RUNNING and was retried for ever, with no error recorded)
    result = failing_tasks.add.enqueue(1, 1)
    broken = "tests.tasks.broken_on_import.task"
    restore_task(result.id, task=broken)
    events = run_worker(lambda: not TaskMessage.objects.exists(), timeout=30)
    record = TaskResultRecord.objects.get(id=result.id)
    assert record.status == "FAILED"
    assert record.attempts == 1 and len(record.worker_ids) == 1
    [error] = record.errors
    assert error["exception_class_path"] == get_module_path(InvalidTask)
    assert "RuntimeError: the module of this task cannot be imported" in error["traceback"]
    assert [m.key for m in events.messages("failed")] == [(result.id,)]
    assert summary(events).failed == 1
    stored = default_task_backend.get_result(result.id)  # (in a process that cannot import it)
    assert stored.status == TaskResultStatus.FAILED and stored.task.module_path == broken


def test_get_result_of_a_waiting_task_whose_function_is_gone() -> None:
    result = failing_tasks.add.enqueue(1, 1)
    gone = "tests.tasks.nowhere.task"
    restore_task(result.id, task=gone)
    stored = default_task_backend.get_result(result.id)
    assert stored.status == TaskResultStatus.READY and stored.args == [1, 1]
    assert stored.task.module_path == gone


def test_a_task_past_the_workers_time_limit_ends_failed_and_the_worker_lives_on(
    run_worker,
) -> None:
    from spanner_queues.exceptions import TimeLimitExceeded

    result = failing_tasks.spin.enqueue(120)
    after = failing_tasks.add.enqueue(2, 3)
    # (the limit is the whole run's, its writes included: on a loaded emulator 0.5 s cut
    # short the quick task too)
    events = run_worker(finished(result, after), options={"timeout": 3.0})
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TimeLimitExceeded
    assert after.return_value == 5
    assert events.counts["timed_out"] == 1 and not events.messages("crashed")
    assert not TaskMessage.objects.exists()

"""``record_from_payload`` builds the result row by position (the worker builds one a task):
each field holds what the same row built by keyword holds."""

from __future__ import annotations

from datetime import UTC, datetime

from spanner_queues.contrib.tasks.backend import record_from_payload
from spanner_queues.contrib.tasks.models import READY, TaskResultRecord, dumps


def test_a_record_built_from_a_payload_holds_each_field_where_the_model_keeps_it() -> None:
    data = {
        "id": "t1",
        "task": "tests.tasks.stored.add",
        "backend": "queues",
        "queue_name": "default",
        "priority": 7,
        "takes_context": True,
        "args": [1, "two"],
        "kwargs": {"three": 3},
        "errors": [{"exception_class_path": "x.Y", "traceback": "..."}],
        "worker_ids": ["w1"],
        "enqueued_at": "2026-12-04T10:00:00+00:00",
        "run_after": "2026-12-04T11:00:00+00:00",
    }
    by_keyword = TaskResultRecord(
        id="t1",
        task_path="tests.tasks.stored.add",
        backend="queues",
        queue_name="default",
        queue="spanner_queues_tasks.TaskMessage",
        priority=7,
        takes_context=True,
        status=READY,
        args_json=dumps([1, "two"]),
        kwargs_json=dumps({"three": 3}),
        errors_json=dumps(data["errors"]),
        worker_ids_json=dumps(["w1"]),
        enqueued_at=datetime(2026, 12, 4, 10, tzinfo=UTC),
        run_after=datetime(2026, 12, 4, 11, tzinfo=UTC),
    )
    record = record_from_payload(data, queue="spanner_queues_tasks.TaskMessage")
    assert record is not None
    for field in TaskResultRecord._meta.concrete_fields:
        assert getattr(record, field.attname) == getattr(by_keyword, field.attname), field.name
    assert record._state.adding and record.return_value_json == "" and record.attempts == 0

"""Task functions of the Tasks tests (module-level, as the framework requires)."""

from __future__ import annotations

from asgiref.sync import sync_to_async

from spanner_queues.contrib.tasks.framework import TaskContext, task
from tests.tasksapp.models import Thing


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def make_thing(num: int) -> int:
    """Writes a row: it commits with the task's SUCCESSFUL status and the ack."""
    return Thing.objects.create(num=num).num


@task()
def fail_after_write(num: int) -> None:
    """Writes a row, then raises: the row rolls back, the result is FAILED."""
    Thing.objects.create(num=num, note="rolled back")
    raise ValueError(f"no thing {num}")


@task()
async def async_add(a: int, b: int) -> int:
    count = await sync_to_async(Thing.objects.count)()
    return a + b + count


@task(takes_context=True)
def attempt_and_id(context: TaskContext) -> dict:
    return {"attempt": context.attempt, "id": context.task_result.id}


@task(queue_name="emails")
def send_email(to: str) -> str:
    return f"sent to {to}"


@task()
def returns_object() -> object:
    return object()  # not JSON: the task fails

"""The documentation's task that takes its context (a module of its own: same name)."""

from __future__ import annotations

from spanner_queues.contrib.tasks.framework import TaskContext, task


@task(takes_context=True)
def calculate_meaning_of_life(context: TaskContext) -> int:
    return 42

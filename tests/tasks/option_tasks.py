"""Tasks with this backend's ``@task(...)`` options (Django 6.1 and the django-tasks backport
hand them to ``QueueBackend.task_class``; Django 6.0 refuses them: import this module only
where ``OPTIONS_REACH_THE_BACKEND``)."""

from __future__ import annotations

import time
from datetime import timedelta

from spanner_queues.contrib.tasks.framework import task

#: runs of each task in this process, by argument (the worker runs in the test's process)
runs: dict[str, int] = {}


def _run(name: str) -> int:
    runs[name] = runs.get(name, 0) + 1
    return runs[name]


@task(max_attempts=3)
def always_fails(name: str) -> None:
    raise ValueError(f"run {_run(name)} of {name} failed")


@task(max_attempts=3)
def fails_once(name: str) -> int:
    run = _run(name)
    if run == 1:
        raise ValueError(f"run {run} of {name} failed")
    return run


@task(max_attempts=2, retry_delay=3600)
def fails_then_waits(name: str) -> None:
    raise ValueError(f"run {_run(name)} of {name} failed")


@task(timeout=2)  # (the whole run's limit, its writes included: 0.5 s was cut short on
# a loaded emulator, see test_failures)
def overruns(seconds: float) -> None:
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.01)


@task(unique_for=timedelta(hours=1))
def daily_digest(user_id: int) -> None:
    _run(f"digest-{user_id}")

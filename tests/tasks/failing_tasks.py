"""Task functions of the failure tests (module-level, as the framework requires)."""

from __future__ import annotations

from spanner_queues.contrib.tasks.framework import task


@task()
def raise_value_error(n: int) -> None:
    raise ValueError(f"task {n} failed")


@task()
def raise_system_exit() -> None:
    raise SystemExit(3)


@task()
def raise_generator_exit() -> None:
    raise GeneratorExit("closed")


@task()
def raise_keyboard_interrupt() -> None:
    raise KeyboardInterrupt("from the task's own code")


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def spin(seconds: float) -> None:
    """Loops in Python (interruptible) for ``seconds``."""
    import time

    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.01)

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


#: set once ``loop_until_cancelled`` runs
LOOPING = __import__("threading").Event()


@task()
def loop_until_cancelled() -> None:
    """Works in steps, looking for a cancel before each (``current_run``: the worker's run)."""
    from spanner_queues.receivers import current_run

    run = current_run()
    assert run is not None
    LOOPING.set()
    while True:
        run.raise_if_cancelled()
        __import__("threading").Event().wait(0.01)  # (one step of work)

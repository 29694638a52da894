from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections

from spanner_queues.worker import Worker, WorkerEvents
from tests.conftest import wait_until


@pytest.fixture
def run_worker() -> Callable[..., WorkerEvents]:
    """Run ``runqueueworker``'s Worker (no queue arguments: every queue with receivers, the
    task queues included) in this process until ``done()`` holds; return its events."""

    def run(
        done: Callable[[], Any], timeout: float = 60.0, options: dict[str, Any] | None = None
    ) -> WorkerEvents:
        import threading

        events = WorkerEvents()
        given = {"install_signal_handlers": False, "poll_interval": 0.05, **(options or {})}
        worker = Worker(listeners=[events], **given)
        failures: list[BaseException] = []

        def target() -> None:
            try:
                worker.run()
            except BaseException as exc:
                failures.append(exc)
            finally:
                connections.close_all()

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        try:
            wait_until(done, timeout=timeout)
        finally:
            worker.stop()
            thread.join(30)
        assert not failures, failures
        return events

    return run

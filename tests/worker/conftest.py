from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connections

from spanner_queues.engines import engines
from spanner_queues.worker import Worker, WorkerEvents


def watch_receives(
    monkeypatch: pytest.MonkeyPatch,
    record: Callable[[dict[str, Any], list[Any]], None],
    *models: Any,
) -> None:
    """Call ``record(kwargs, messages)`` after every receive of ``models``' engines: the
    worker's intake asks each queue's engine itself (``Plan.engine``), not ``api.receive``."""
    from spanner_queues.engines import engine_for

    for engine_class in {type(engine_for(model)) for model in models}:
        real = engine_class.receive

        def receive(self: Any, model: Any, _real: Any = real, **kwargs: Any) -> list[Any]:
            got = _real(self, model, **kwargs)
            record(kwargs, got)
            return got

        monkeypatch.setattr(engine_class, "receive", receive)


def require(feature: str) -> None:
    """Skip unless the default engine has ``feature`` (tests gate on features, not vendors)."""
    if not getattr(engines["default"].features, feature):
        pytest.skip(f"engine lacks {feature}")


@pytest.fixture
def events() -> WorkerEvents:
    return WorkerEvents()


@pytest.fixture
def make_worker(events: WorkerEvents) -> Callable[..., Worker]:
    def make(*queues: Any, **options: Any) -> Worker:
        options.setdefault("install_signal_handlers", False)
        options.setdefault("listeners", [events])
        options.setdefault("poll_interval", 0.05)
        return Worker(list(queues) or None, **options)

    return make


@contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    """Run ``worker`` in a thread for the block; stop it (gracefully) at the end."""
    failures: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # surfaced in the test below
            failures.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name="test-worker")
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(120)
    assert not thread.is_alive(), "worker did not stop"
    assert not failures, failures

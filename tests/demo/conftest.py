"""Helpers for the demo tests: run the worker in burst mode or in a thread, and wait on its
events. Collected only under ``tests.settings_demo`` (the demo apps must be installed)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings

if "demo_project.shop" not in settings.INSTALLED_APPS:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture
def events() -> Any:
    from spanner_queues.worker import WorkerEvents

    return WorkerEvents()


@pytest.fixture
def worker(events: Any) -> Callable[..., Any]:
    """``worker(Queue, ...)``: a Worker for those queues that reports to ``events``."""
    from spanner_queues.worker import Worker

    def make(*queues: Any, **options: Any) -> Worker:
        options.setdefault("install_signal_handlers", False)
        options.setdefault("listeners", [events])
        options.setdefault("poll_interval", 0.05)
        return Worker(list(queues), **options)

    return make


@pytest.fixture
def drain(worker: Callable[..., Any]) -> Callable[..., Any]:
    """``drain(Queue, ...)``: process every message of those queues that is due now (burst)."""

    def run(*queues: Any, **options: Any) -> Any:
        return worker(*queues, burst=True, **options).run()

    return run


@pytest.fixture(autouse=True)
def _fresh_carrier() -> Iterator[None]:
    from demo_project.shop.carrier import carrier

    carrier._calls.clear()
    yield
    carrier._calls.clear()


@contextmanager
def running(worker: Any) -> Iterator[Any]:
    """Run ``worker`` in a thread for the block, then stop it gracefully."""
    failures: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=target, name="demo-test-worker")
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(120)
    assert not thread.is_alive(), "worker did not stop"
    assert not failures, failures

"""Statements sent to the database by every thread's connection (a worker's threads open their
own), for tests that count what a delivery costs."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from django.db.backends.signals import connection_created


@contextlib.contextmanager
def statements_matching(test: Callable[[str], bool]) -> Iterator[list[tuple[str, bool]]]:
    """Collect ``(sql, many)`` of each statement for which ``test(sql)`` holds, sent by the
    connections opened meanwhile (in any thread): an ``executemany`` is one statement sent."""
    seen: list[tuple[str, bool]] = []
    lock = threading.Lock()

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if test(sql):
            with lock:
                seen.append((sql, many))
        return execute(sql, params, many, context)

    def created(sender: Any, connection: Any, **kwargs: Any) -> None:
        connection.execute_wrappers.append(wrapper)

    connection_created.connect(created, weak=False)
    try:
        yield seen
    finally:
        connection_created.disconnect(created)

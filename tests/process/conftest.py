"""The ``children`` fixture: start ``runqueueworker`` child processes on the test's database;
each is killed when the test ends."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.children import Child, Start


@pytest.fixture
def children(child_env: dict[str, str], tmp_path: Path) -> Iterator[Start]:
    started: list[Child] = []

    def start(*args: str, name: str = "w", kind: type[Child] = Child) -> Child:
        child = kind(child_env, tmp_path, *args, name=name)
        started.append(child)
        return child

    yield start
    (tmp_path / "release").touch()  # a receiver of a failed test blocked on it may finish
    for child in started:
        child.kill()

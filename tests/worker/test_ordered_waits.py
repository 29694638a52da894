"""A native ordered queue's message received behind its key's head waits before it comes again:
1 s the first time, each further wait twice as long, up to 30 s (``ordering.wait``), so that a
head failing for long does not have its key's other messages received every second."""

from __future__ import annotations

from datetime import timedelta

import pytest

from spanner_queues.ordering import MAX_WAIT_SECONDS, wait

pytestmark = pytest.mark.engine_independent


def test_the_wait_behind_a_head_doubles_up_to_its_cap() -> None:
    assert [wait(n).total_seconds() for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert wait(10_000) == timedelta(seconds=MAX_WAIT_SECONDS)

"""``Retry``'s message says when the message comes back: never ``retry after None``."""

from __future__ import annotations

from datetime import timedelta

import pytest

from spanner_queues import Retry

pytestmark = pytest.mark.engine_independent  # an exception's text


def test_a_retry_without_after_says_the_back_off() -> None:
    assert str(Retry()) == "retry after the back-off"
    assert str(Retry(after=90)) == f"retry after {timedelta(seconds=90)}"
    assert str(Retry(reason="the worker is stopping")) == "the worker is stopping"

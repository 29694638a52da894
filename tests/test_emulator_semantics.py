"""The emulator front's queue choices are the table engine's: the distribution
``spanner-queues-emulator`` keeps its own copy of ``spanner_queues.semantics`` (it imports no
app), and this pins that the two agree."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from spanner_queues import semantics as app
from spanner_queues_emulator import semantics as front


def test_lease_and_receive_defaults_agree() -> None:
    assert front.LEASE == app.LEASE
    assert front.DEFAULT_MAX_BATCH_SIZE == app.DEFAULT_MAX_BATCH_SIZE
    assert front.DEFAULT_MAX_DURATION == app.DEFAULT_MAX_DURATION


def test_backoff_policies_agree() -> None:
    assert dataclasses.asdict(front.BackoffPolicy()) == dataclasses.asdict(app.BackoffPolicy())
    ours, theirs = front.BackoffPolicy(), app.BackoffPolicy()
    for attempt in (0, 1, 2, 5, 11, 40, 200):
        for age in (timedelta(0), timedelta(minutes=59), timedelta(hours=2)):
            assert ours.longest(attempt, age) == theirs.longest(attempt, age)
            assert ours.shortest(attempt, age) == theirs.shortest(attempt, age)


@pytest.mark.parametrize("text", ["500ms", "90s", "20m", "1h30m", "1.5s", " 2m "])
def test_durations_parse_alike(text: str) -> None:
    assert front.parse_duration(text) == app.parse_duration(text)


@pytest.mark.parametrize("text", ["", "0s", "5", "1x", "s", "1h 30m"])
def test_bad_durations_are_refused_alike(text: str) -> None:
    with pytest.raises(ValueError):
        app.parse_duration(text)
    with pytest.raises(ValueError):
        front.parse_duration(text)

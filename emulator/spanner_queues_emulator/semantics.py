"""Queue behaviour Google's documentation leaves open, as the front decides it.

The same choices as ``spanner_queues.semantics`` (the app's table engine), copied so that this
distribution depends on no Django app; ``tests/test_emulator_semantics.py`` in the app's
repository checks that the two agree:

- the lease: 10 s from delivery or renewal (documented by Google, not configurable there);
- the back-off after a lease expires: exponential from 1 s (x2, at most 15 min) while the
  message is younger than an hour, then hourly, with 20 % jitter (Google documents the shape);
- ``RECEIVE_<Q>`` defaults: ``max_batch_size`` 1, ``max_duration`` one minute;
- ``max_duration`` text: Go-style durations (``"500ms"``, ``"90s"``, ``"20m"``, ``"1h30m"``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from datetime import timedelta

#: Spanner's lease: 10 s from delivery or from a renewal.
LEASE = timedelta(seconds=10)
#: ``RECEIVE_<Q>()`` without ``max_batch_size``.
DEFAULT_MAX_BATCH_SIZE = 1
#: ``RECEIVE_<Q>()`` without ``max_duration``.
DEFAULT_MAX_DURATION = timedelta(minutes=1)

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True, kw_only=True)
class BackoffPolicy:
    """Redelivery delay after a lease expires without an ack: exponential while the message is
    younger than ``hourly_after``, then one attempt per ``hourly``; ``delay`` draws uniformly
    from ``[longest * (1 - jitter), longest]``."""

    initial: timedelta = timedelta(seconds=1)
    multiplier: float = 2.0
    maximum: timedelta = timedelta(minutes=15)
    hourly_after: timedelta = timedelta(hours=1)
    hourly: timedelta = timedelta(hours=1)
    jitter: float = 0.2

    def longest(self, attempt: int, age: timedelta) -> timedelta:
        """The wait without jitter."""
        if age >= self.hourly_after:
            return self.hourly
        exponent = min(max(attempt - 1, 0), 64)
        seconds = self.initial.total_seconds() * (self.multiplier**exponent)
        return min(timedelta(seconds=min(seconds, 10**9)), self.maximum)

    def shortest(self, attempt: int, age: timedelta) -> timedelta:
        """The shortest wait ``delay`` can draw."""
        return self.longest(attempt, age) * (1 - self.jitter)

    def delay(self, attempt: int, age: timedelta) -> timedelta:
        """The wait after delivery ``attempt`` of a message sent ``age`` ago, jittered."""
        return self.longest(attempt, age) * (1 - self.jitter * random.random())


def parse_duration(text: str) -> timedelta:
    """``"20m"``, ``"90s"``, ``"500ms"``, ``"1h30m"`` -> timedelta; ``ValueError`` otherwise."""
    value = str(text).strip()
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(value):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if not value or pos != len(value) or total <= 0:
        raise ValueError(
            f"max_duration {text!r} is not a positive duration like '500ms', '90s', '20m', '1h'."
        )
    return timedelta(seconds=total)

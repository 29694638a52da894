"""Answers Google leaves open that the front can be told to give (besides ``short_receive``,
``receiving``): each a mode chosen on the command line, by an environment variable, or in a
test with ``FrontControl.configure(...)``; ``clear()`` restores the front's own choice.

- ``backoff``: when a message whose lease ended unacked is due again (``BACKOFF_MODES``):
  ``exponential`` (the default, Google's documented shape: 1 s doubling to 15 min from the
  lease's end while the message is younger than an hour, then hourly, 20 % jitter), ``none``
  (due again as its lease ends), ``slow`` (the same curve from 10 s: a first redelivery 8-10 s
  after the lease's end).
- ``retry_info``: whether an ABORTED carries a ``google.rpc.RetryInfo`` trailer
  (``RETRY_INFO_MODES``): ``always`` (the default: Cloud Spanner sends one with every ABORTED,
  and the DB-API's replay waits what it says) or ``never`` (as Google's emulator: the DB-API
  then waits ``2**attempt`` seconds before each replay).
"""

from __future__ import annotations

import os
from datetime import timedelta

from spanner_queues_emulator.semantics import BackoffPolicy

#: how the front backs off a message whose lease ended unacked; the first is the default.
BACKOFF_MODES = ("exponential", "none", "slow")
BACKOFF_ENV = "SPANNER_QUEUES_EMULATOR_BACKOFF"
#: whether an ABORTED carries a RetryInfo; the first is the default.
RETRY_INFO_MODES = ("always", "never")
RETRY_INFO_ENV = "SPANNER_QUEUES_EMULATOR_RETRY_INFO"

#: the curve of each back-off mode
BACKOFF_POLICIES = {
    "exponential": BackoffPolicy(),
    "none": BackoffPolicy(initial=timedelta(0), maximum=timedelta(0), hourly=timedelta(0)),
    "slow": BackoffPolicy(initial=timedelta(seconds=10)),
}


def mode(name: str, value: str | None, modes: tuple[str, ...], env: str) -> str:
    """``value``, else the environment variable ``env``, else the first of ``modes``;
    ``ValueError`` naming ``name`` when it is not one of ``modes``."""
    chosen = value if value is not None else os.environ.get(env) or modes[0]
    if chosen not in modes:
        raise ValueError(f"{name} must be one of {', '.join(modes)}, not {chosen!r}")
    return chosen


def backoff_mode(value: str | None = None) -> str:
    return mode("backoff", value, BACKOFF_MODES, BACKOFF_ENV)


def retry_info_mode(value: str | None = None) -> str:
    return mode("retry_info", value, RETRY_INFO_MODES, RETRY_INFO_ENV)

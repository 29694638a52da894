"""The ``SPANNER_QUEUES_METRICS`` setting, parsed into a frozen ``MetricsParams``, and its system
check (``spanner_queues.E201``, registered by the app's ``ready()``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core import checks

from spanner_queues.conf import MIN_SAMPLE_INTERVAL
from spanner_queues.exceptions import InvalidQueueEngine, QueueConfigurationError

__all__ = [
    "MetricsParams",
    "MetricsUnavailable",
    "check_setting",
    "metrics_params",
    "parse_metrics",
]

METRICS_KEYS = frozenset({"VIEW", "TOKEN", "SAMPLE_INTERVAL_SECONDS", "RECORD_DEPTH_SAMPLES"})


class MetricsUnavailable(QueueConfigurationError):
    """The metrics app is installed (or its modules imported) but prometheus-client is not."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsParams:
    """The ``SPANNER_QUEUES_METRICS`` setting."""

    #: serve ``spanner_queues.contrib.metrics.views.metrics_view`` (404 otherwise)
    view: bool = False
    #: a bearer token the view accepts besides staff sessions
    token: str | None = None
    #: how often a worker reads the queue gauges (and the view at most)
    sample_interval: float = 30.0
    #: whether a worker serving metrics also stores depth samples for the admin's chart
    record_depth_samples: bool = True


def parse_metrics(raw: Any) -> MetricsParams:
    """Validate ``SPANNER_QUEUES_METRICS``; ``InvalidQueueEngine`` with the reason."""
    if raw is None:
        return MetricsParams()
    if not isinstance(raw, Mapping):
        raise InvalidQueueEngine("SPANNER_QUEUES_METRICS must be a dict.")
    unknown = set(raw) - METRICS_KEYS
    if unknown:
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES_METRICS has unknown keys: {', '.join(sorted(unknown))}. "
            f"Known: {', '.join(sorted(METRICS_KEYS))}."
        )
    token = raw.get("TOKEN")
    if token is not None and (
        not isinstance(token, str) or len(token) < 16 or any(c.isspace() for c in token)
    ):
        raise InvalidQueueEngine(
            "SPANNER_QUEUES_METRICS['TOKEN'] must be a string of at least 16 characters, "
            "without spaces (a bearer token)."
        )
    interval = raw.get("SAMPLE_INTERVAL_SECONDS", 30.0)
    if (
        isinstance(interval, bool)
        or not isinstance(interval, (int, float))
        or not (MIN_SAMPLE_INTERVAL <= interval < float("inf"))
    ):
        raise InvalidQueueEngine(
            "SPANNER_QUEUES_METRICS['SAMPLE_INTERVAL_SECONDS'] must be a number of seconds, at "
            f"least {MIN_SAMPLE_INTERVAL:g}, not {interval!r}."
        )
    for key in ("VIEW", "RECORD_DEPTH_SAMPLES"):
        if key in raw and not isinstance(raw[key], bool):
            raise InvalidQueueEngine(
                f"SPANNER_QUEUES_METRICS[{key!r}] must be True or False, not {raw[key]!r}."
            )
    return MetricsParams(
        view=raw.get("VIEW", False),
        token=token,
        sample_interval=float(interval),
        record_depth_samples=raw.get("RECORD_DEPTH_SAMPLES", True),
    )


def metrics_params() -> MetricsParams:
    """``SPANNER_QUEUES_METRICS`` as it is now (read on each call: tests override it)."""
    return parse_metrics(getattr(settings, "SPANNER_QUEUES_METRICS", None))


def check_setting(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E201: ``SPANNER_QUEUES_METRICS`` is invalid (the view would answer 500 on every scrape,
    the worker refuse to serve)."""
    try:
        metrics_params()
    except QueueConfigurationError as exc:
        return [
            checks.Error(
                str(exc),
                hint='For example {"VIEW": True, "TOKEN": "<16 or more characters, no '
                f'spaces>", "SAMPLE_INTERVAL_SECONDS": 30}} (at least {MIN_SAMPLE_INTERVAL:g}); '
                "VIEW and RECORD_DEPTH_SAMPLES are True or False. See docs/howto/metrics.md.",
                id="spanner_queues.E201",
            )
        ]
    return []

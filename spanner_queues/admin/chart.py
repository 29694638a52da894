"""Queue depth over time as inline SVG geometry (no JavaScript): the template draws the lines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from spanner_queues import clock
from spanner_queues.monitoring import QueueDepthSample

if TYPE_CHECKING:
    from spanner_queues.engines.base import QueueStats

CHART_WINDOW = timedelta(hours=24)
MAX_POINTS = 300
SERIES = ("total", "ready", "scheduled", "leased")


#: what the pages call each series (the states' names stay in URLs and CSS classes): a due
#: message waits for a receiver, a leased one is in flight
SERIES_LABELS = {"total": "total", "ready": "due", "scheduled": "scheduled", "leased": "in flight"}


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    points: str
    last: int

    @property
    def label(self) -> str:
        return SERIES_LABELS.get(self.name, self.name)


@dataclass(frozen=True, slots=True)
class DepthChart:
    """Polylines in a ``width`` x ``height`` box; y grows downwards. ``peak``: the highest
    count drawn (0 for a queue that stayed empty); the top of the box is ``peak`` (1 when 0)."""

    width: int
    height: int
    series: list[Series]
    area: str
    peak: int
    start: datetime
    end: datetime
    samples: int

    @property
    def total(self) -> Series:
        return self.series[0]


def recent_samples(queue: str, live: QueueStats | None = None) -> list[QueueDepthSample]:
    """The queue's samples within ``CHART_WINDOW``, oldest first, thinned to ``MAX_POINTS``,
    ending with ``live`` counts (not stored) so that the chart ends at what the page shows."""
    now = live.measured_at if live else clock.now()
    samples = list(
        QueueDepthSample.objects.filter(queue=queue, measured_at__gte=now - CHART_WINDOW).order_by(
            "measured_at"
        )
    )
    if len(samples) > MAX_POINTS:
        step = len(samples) / MAX_POINTS
        samples = [samples[int(i * step)] for i in range(MAX_POINTS - 1)] + [samples[-1]]
    if live and not (samples and samples[-1].measured_at >= live.measured_at):
        samples.append(QueueDepthSample.from_stats(live))
    return samples


def depth_chart(
    samples: Sequence[QueueDepthSample],
    *,
    width: int = 110,
    height: int = 28,
    series: Sequence[str] = ("total",),
) -> DepthChart | None:
    """Chart geometry for ``samples`` (oldest first); None without samples."""
    if not samples:
        return None
    start, end = samples[0].measured_at, samples[-1].measured_at
    span = (end - start).total_seconds() or 1.0
    peak = max(max(getattr(s, name) for name in series) for s in samples)
    scale = peak or 1  # an always-empty queue: flat at the bottom, and its peak is 0
    pad = 2
    inner_w, inner_h = width - 2 * pad, height - 2 * pad

    def xy(sample: QueueDepthSample, value: int) -> tuple[float, float]:
        x = pad + inner_w * ((sample.measured_at - start).total_seconds() / span)
        if len(samples) == 1:
            x = pad + inner_w
        return x, pad + inner_h * (1 - value / scale)

    lines = []
    for name in series:
        coords = [xy(s, getattr(s, name)) for s in samples]
        if len(coords) == 1:  # one sample: a flat line across
            coords = [(float(pad), coords[0][1]), coords[0]]
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        lines.append(Series(name=name, points=points, last=getattr(samples[-1], name)))
    first_x = lines[0].points.split(" ", 1)[0].split(",")[0]
    last_x = lines[0].points.rsplit(" ", 1)[-1].split(",")[0]
    bottom = f"{pad + inner_h:.1f}"
    area = f"{first_x},{bottom} {lines[0].points} {last_x},{bottom}"
    return DepthChart(
        width=width,
        height=height,
        series=lines,
        area=area,
        peak=peak,
        start=start,
        end=end,
        samples=len(samples),
    )

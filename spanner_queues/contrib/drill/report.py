"""The drill's report: ``report.md`` (figures, verdict, timeline, method), ``depth.svg`` (queue
depth over time with the kills and aborts marked) and ``report.json`` (the same figures, for
machines). The chart's geometry is the admin's (``admin.chart.depth_chart``)."""

from __future__ import annotations

import json
import shlex
from html import escape
from pathlib import Path

from spanner_queues.admin.chart import depth_chart
from spanner_queues.contrib.drill.runner import DrillOptions, DrillResult

#: listed in the report at most (the JSON file has them all)
SHOWN_KEYS = 20
MARKS = {"kill": "#c0392b", "term": "#8e44ad", "abort": "#e67e22", "exit": "#7f8c8d"}
ENVIRONMENT_NAMES = {
    "spanner_queues": "spanner_queues",
    "django": "Django",
    "driver": "database driver",
    "database_server": "database server",
    "python": "Python",
    "host": "host",
    "platform": "platform",
    "pubsub_client": "google-cloud-pubsub",
    "pubsub_server": "Pub/Sub",
}


def depth_svg(result: DrillResult, *, width: int = 720, height: int = 260) -> str:
    """An SVG document: the drill queue's depth (total; the Pub/Sub mode: both queues') over
    the run, a vertical line per kill (red), SIGTERM (purple), abort (orange) and unexpected
    worker exit (grey)."""
    left, right, top, bottom = 56, 16, 28, 36
    inner_w, inner_h = width - left - right, height - top - bottom
    chart = depth_chart(result.samples, width=inner_w, height=inner_h)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        '<rect width="100%" height="100%" fill="white"/>',
        f'<text x="{left}" y="16" font-size="13">{escape(result.queue)}: depth during the '
        f"fault drill (run {escape(result.run)})</text>",
    ]
    if chart is None:
        parts.append(f'<text x="{left}" y="{top + 20}">no samples</text></svg>')
        return "\n".join(parts)
    span = (chart.end - chart.start).total_seconds() or 1.0
    pad = 2
    parts += [
        f'<g transform="translate({left},{top})">',
        f'<rect x="0" y="0" width="{inner_w}" height="{inner_h}" fill="none" stroke="#999"/>',
        f'<polygon points="{chart.area}" fill="#3498db" fill-opacity="0.15"/>',
        f'<polyline points="{chart.total.points}" fill="none" stroke="#2471a3" '
        'stroke-width="1.5"/>',
    ]
    for event in result.events:
        color = MARKS.get(event.kind)
        if color is None:
            continue
        offset = (event.at - chart.start).total_seconds() / span
        x = pad + (inner_w - 2 * pad) * min(max(offset, 0.0), 1.0)
        parts.append(
            f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{inner_h}" stroke="{color}" '
            f'stroke-dasharray="4 3"><title>{escape(event.kind)} at {event.elapsed:.2f} s: '
            f"{escape(event.detail)}</title></line>"
        )
    parts += [
        f'<text x="-6" y="{pad + 4}" text-anchor="end">{chart.peak}</text>',
        f'<text x="-6" y="{inner_h - pad}" text-anchor="end">0</text>',
        f'<text x="0" y="{inner_h + 14}">0 s</text>',
        f'<text x="{inner_w}" y="{inner_h + 14}" text-anchor="end">{span:.1f} s</text>',
        "</g>",
    ]
    legend_y = height - 8
    legend = [("#2471a3", "messages in the queue"), *[(c, k) for k, c in MARKS.items()]]
    x = left
    for color, label in legend:
        parts.append(
            f'<line x1="{x}" y1="{legend_y - 4}" x2="{x + 18}" y2="{legend_y - 4}" '
            f'stroke="{color}" stroke-width="2"/>'
            f'<text x="{x + 22}" y="{legend_y}">{escape(label)}</text>'
        )
        x += 30 + 7 * len(label)
    parts.append("</svg>")
    return "\n".join(parts)


def _keys(keys: list[str]) -> str:
    shown = ", ".join(f"`{k}`" for k in keys[:SHOWN_KEYS])
    more = f" and {len(keys) - SHOWN_KEYS} more (report.json)" if len(keys) > SHOWN_KEYS else ""
    return shown + more


def markdown(result: DrillResult, command: list[str]) -> str:
    """The report a team can attach to a production readiness review."""
    lines = [*_figures(result), *_notes(result)]
    lines += ["## Timeline", "", "| t (s) | event | detail |", "|---:|---|---|"]
    lines += [f"| {e.elapsed:.2f} | {e.kind} | {e.detail} |" for e in result.events]
    lines += _method(result, command)
    return "\n".join(lines)


def _figures(result: DrillResult) -> list[str]:
    """The verdict, the figures table and the environment."""
    o = result.options
    verdict = "PASS" if result.passed else "FAIL"
    abort_how = {
        "none": "none injected",
        "pg-terminate": "PostgreSQL sessions of the drill's workers terminated",
        "command": "`--abort-command` run, see Command",
    }[o.abort_method]
    redelivered = "n/a (the engine counts no deliveries)"
    if result.redelivered is not None:
        redelivered = str(result.redelivered)
    pubsub = result.mode == "pubsub"
    workers = (
        f"{o.workers} relay and {o.workers} inbox processes x {o.concurrency} threads"
        if pubsub
        else f"{o.workers} processes x {o.concurrency} threads"
    )
    return [
        f"# Queue fault drill: {verdict}" + (" (Pub/Sub: relay and inbox)" if pubsub else ""),
        "",
        f"Run `{result.run}`, started {result.started_at:%Y-%m-%d %H:%M:%S} UTC, on database "
        f"`{result.database}` (`{result.database_engine}`) with queue engine "
        f"`{result.engine}`, queue `{result.queue}`.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| messages sent | {result.sent} (in {result.send_seconds:.2f} s) |",
        f"| workers | {workers} (`runqueueworker`), {o.work_ms:g} ms of work per message |",
        f"| kills (SIGKILL) | {result.kills} |",
        *([f"| stops (SIGTERM) | {result.terms} |"] if o.signal != "kill" else []),
        f"| aborts injected | {result.aborts} ({abort_how}) |",
        f"| aborted transactions run again in the workers (seen) | {result.retries_seen} |",
        f"| unexpected worker exits | {result.unexpected_exits} |",
        f"| deliveries after the first (attempt > 1) | {redelivered} |",
        f"| handled (effect committed at least once) | {result.handled} |",
        f"| **lost** (sent, never handled) | **{result.lost}** |",
        f"| **handled twice** (more than one effect) | **{result.twice}** |",
        f"| effect rows | {result.effects} |",
        f"| drained | {'yes' if result.drained else 'NO'} |",
        f"| time to drain (from the first send) | {result.drain_seconds:.2f} s |",
        f"| left in the queue after the drill | {result.left_in_queue} |",
        f"| run commits per message (the workers' last summary lines) | "
        f"{_ratio(result.commits_per_message)} |",
        f"| messages per group (group commit) | {_ratio(result.group_size)} |",
        *(_pubsub_figures(result) if pubsub else []),
        *(_ordered_figures(result) if result.options.ordered else []),
        "",
        "![queue depth over time](depth.svg)",
        "",
        "## Environment",
        "",
        "| | |",
        "|---|---|",
        *[f"| {ENVIRONMENT_NAMES.get(k, k)} | {v} |" for k, v in result.environment.items()],
        f"| random seed | {o.seed} (`--seed`) |",
        "",
    ]


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _pubsub_figures(result: DrillResult) -> list[str]:
    """The figures of a drill through Pub/Sub (``--pubsub``)."""
    return [
        f"| published by the relay (confirmed; more than sent: published again) | "
        f"{result.published} |",
        f"| duplicates dropped by the inbox | {result.duplicates_dropped} |",
        f"| Pub/Sub failures felt: publishes given back by the relay, failed inbox pulls | "
        f"{result.publish_failures}, {result.pull_failures} |",
        f"| **left in Pub/Sub** (taken in by the closing pull) | "
        f"**{result.left_on_subscription}** |",
        f"| **dead-lettered** (refused by Pub/Sub) | **{result.dead_lettered}** |",
        f"| topic, subscription | `{result.pubsub.get('topic')}`, "
        f"`{result.pubsub.get('subscription')}` |",
    ]


def _ordered_figures(result: DrillResult) -> list[str]:
    """The figures of an ordered drill (``--ordered``)."""
    streams = min(result.options.streams, max(result.sent, 1))
    return [
        f"| ordering keys (streams), messages each | {streams}, up to "
        f"{-(-result.sent // streams)} |",
        f"| **out of order** (a gap, an inversion or a double in a stream) | "
        f"**{len(result.order_violations)}** |",
    ]


def _notes(result: DrillResult) -> list[str]:
    """The keys lost or handled twice, and the earlier runs' leftovers."""
    lines: list[str] = []
    if result.lost_keys:
        lines += [f"Lost: {_keys(result.lost_keys)}.", ""]
    if result.twice_keys:
        lines += [f"Handled twice: {_keys(result.twice_keys)}.", ""]
    if result.order_violations:
        shown = "; ".join(result.order_violations[:20])
        more = len(result.order_violations) - 20
        lines += [f"Out of order: {shown}{f' (and {more} more)' if more > 0 else ''}.", ""]
    if result.leftovers_at_start:
        lines += [
            f"The queue held {result.leftovers_at_start} messages of earlier runs at the start; "
            "the workers drained them too (they count in the depth, not in the figures).",
            "",
        ]
    return lines


def _method(result: DrillResult, command: list[str]) -> list[str]:
    """How it was measured, the command and the workers' logs."""
    o = result.options
    pubsub = result.mode == "pubsub"
    outbox, _, inbox = (
        name.rsplit(".", 1)[-1] for name in result.queue.partition(" -> Pub/Sub -> ")
    )
    how = (
        f"Service A's relay workers publish each event of `{outbox}` to the topic and ack it "
        "once Pub/Sub confirmed the publish; service B's inbox workers pull the subscription, "
        f"take each event id in once (`SeenEvent`, the dedup window) into `{inbox}`, whose "
        "receiver writes the effect row. Relay and inbox workers were killed alike. After the "
        "drain the workers ran on until the subscription's ack deadline had passed since the "
        "last inbox stop (or abort), then stopped; the drill then pulled the subscription "
        "itself until a pull was empty (an event it took in was left in Pub/Sub). Published "
        "and duplicates dropped are counted by the workers as they happen (a count of a worker "
        "SIGKILLed just after can be missing): at least these. "
        if pubsub
        else ""
    )
    if o.ordered:
        how += (
            "The messages are numbered in streams, one ordering key each (the queue's "
            "`ordered_by`"
            + (
                "; the relay publishes a stream's events with the stream as their Pub/Sub "
                "ordering key, the subscription has message ordering on, and the ordered inbox "
                "takes each in under that key"
                if pubsub
                else ""
            )
            + "). Each effect records the highest number of its stream whose effect had "
            "committed when its transaction read it: a stream ran in order, one at a time, "
            "each message once, when every effect says its number less one (else a gap, an "
            "inversion or a double: out of order). "
        )
    verdict = (
        "The verdict is PASS when both queues drained with 0 lost and 0 handled twice, and "
        "nothing was left in a queue, in Pub/Sub or dead-lettered"
        if pubsub
        else "The verdict is PASS when the queue drained with 0 lost and 0 handled twice"
    )
    verdict += ", and no stream ran out of order." if o.ordered else "."
    return [
        "",
        "## How it was measured",
        "",
        how + "Each message's receiver writes one row to `sq_drill_effects` in its own "
        "transaction, "
        "the one that also acks the message. After the queue is empty the drill counts rows per "
        "message key: no row is a lost message, more than one row is a message whose work "
        "committed twice. "
        + (
            "Workers were SIGKILLed at random points of the drain (each replaced by a new "
            "one); a killed worker's messages come back after their lease. "
            if o.kills
            else ""
        )
        + verdict,
        "",
        "## Command",
        "",
        "```",
        shlex.join(command),
        "```",
        "",
        "Worker output: " + ", ".join(f"`workers/{p.name}`" for p in result.worker_logs) + ".",
        "",
    ]


def as_json(result: DrillResult) -> dict:
    """The drill's result as ``report.json`` holds it: its figures, the options it ran with,
    its events and depth samples."""
    return {
        "run": result.run,
        "passed": result.passed,
        "started_at": result.started_at.isoformat(),
        "database": result.database,
        "database_engine": result.database_engine,
        "engine": result.engine,
        "queue": result.queue,
        "mode": result.mode,
        "options": _options_json(result.options),
        "environment": result.environment,
        "sent": result.sent,
        "kills": result.kills,
        "terms": result.terms,
        "aborts": result.aborts,
        "retries_seen": result.retries_seen,
        "commits_per_message": result.commits_per_message,
        "group_size": result.group_size,
        "unexpected_exits": result.unexpected_exits,
        "redelivered": result.redelivered,
        "handled": result.handled,
        "lost": result.lost,
        "twice": result.twice,
        "effects": result.effects,
        "drained": result.drained,
        "drain_seconds": round(result.drain_seconds, 3),
        "left_in_queue": result.left_in_queue,
        "pubsub": result.pubsub or None,
        "published": result.published,
        "duplicates_dropped": result.duplicates_dropped,
        "left_on_subscription": result.left_on_subscription,
        "dead_lettered": result.dead_lettered,
        "publish_failures": result.publish_failures,
        "pull_failures": result.pull_failures,
        "lost_keys": result.lost_keys,
        "twice_keys": result.twice_keys,
        "order_violations": result.order_violations,
        **_series_json(result),
    }


def _options_json(o: DrillOptions) -> dict:
    """The drill's options as run (``worker_args`` as a list)."""
    return {
        "messages": o.messages,
        "workers": o.workers,
        "concurrency": o.concurrency,
        "kills": o.kills,
        "lease": o.lease,
        "work_ms": o.work_ms,
        "abort_every": o.abort_every,
        "abort_method": o.abort_method,
        "abort_command": o.abort_command,
        "timeout": o.timeout,
        "seed": o.seed,
        "worker_args": list(o.worker_args),
        "allow_shared_database": o.allow_shared_database,
        "pubsub": o.pubsub,
        "signal": o.signal,
        "ordered": o.ordered,
        "streams": o.streams,
    }


def _series_json(result: DrillResult) -> dict:
    """The drill's timeline: its events and the queue depth samples, times in seconds from the
    start (rounded to ms) or ISO 8601."""
    return {
        "events": [
            {"elapsed": round(e.elapsed, 3), "kind": e.kind, "detail": e.detail}
            for e in result.events
        ],
        "depth": [
            {
                "at": s.measured_at.isoformat(),
                "total": s.total,
                "ready": s.ready,
                "leased": s.leased,
            }
            for s in result.samples
        ],
    }


def write_report(result: DrillResult, directory: Path, command: list[str]) -> Path:
    """Write ``report.md``, ``depth.svg`` and ``report.json`` into ``directory``; the path of
    ``report.md``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "depth.svg").write_text(depth_svg(result))
    (directory / "report.json").write_text(json.dumps(as_json(result), indent=2) + "\n")
    path = directory / "report.md"
    path.write_text(markdown(result, command))
    return path

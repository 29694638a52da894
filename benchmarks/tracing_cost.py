"""What the CloudEvents envelope and the tracing app cost per message, side by side in one run
on SQLite: a send (``Queue.send`` calls in one ``atomic()``, so the commit's fsync does not
drown the sends' own work) and a worker run (an in-process ``Worker``,
``--burst``, concurrency 1, a receiver that reads the payload) of a json queue in three modes:

- ``raw``: ``tests.tracingapp.models.RawEvents``, no envelope, tracing off;
- ``envelope``: ``Events`` (``envelope = "cloudevents"``), tracing off;
- ``envelope+tracing``: ``Events`` with ``QueueTracing`` installed and the OpenTelemetry SDK
  recording every span (a ``BatchSpanProcessor`` whose exporter drops them: the spans' cost,
  not an exporter's network).

    .venv/bin/python benchmarks/tracing_cost.py                   # 5 rounds of 500 messages
    .venv/bin/python benchmarks/tracing_cost.py --rounds 3 --messages 200

The modes alternate within each round; the medians over the rounds are printed in
microseconds per message. The worker run is dominated by its per-message commit; "receive side"
is what a run adds without it (``_consumer_overhead``): opening the event and the CONSUMER
span.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODES = ("raw", "envelope", "envelope+tracing")


def _sdk() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)


def _round(mode: str, messages: int) -> tuple[float, float]:
    from django.db import transaction

    from spanner_queues import instrumentation
    from spanner_queues.contrib.tracing import QueueTracing
    from spanner_queues.receivers import ReceiverRegistry, receiver
    from spanner_queues.worker import Worker
    from tests.tracingapp.models import Events, RawEvents

    queue = RawEvents if mode == "raw" else Events
    instrumentation.install(QueueTracing() if mode == "envelope+tracing" else None)
    try:
        payload = {"order": 7, "lines": [{"sku": "A-1", "qty": 2}], "note": "x" * 64}
        started = time.perf_counter()
        with transaction.atomic():  # (one commit: the sends' own work, not SQLite's fsync)
            for i in range(messages):
                queue.send(id=f"{mode}-{i}", payload=payload)
        send = (time.perf_counter() - started) / messages

        registry = ReceiverRegistry()
        receiver(queue, registry=registry)(lambda message: message.json())
        worker = Worker([queue], registry=registry, burst=True, install_signal_handlers=False)
        started = time.perf_counter()
        stats = worker.run()
        run = (time.perf_counter() - started) / messages
        assert stats.processed == messages, stats
        return send * 1e6, run * 1e6
    finally:
        instrumentation.install(None)


def _consumer_overhead(messages: int) -> dict[str, float]:
    """Microseconds per message of what a receiver run adds, without the worker's commit: reading
    ``json()`` of a fresh ``Message`` of each queue, and on the envelope queue inside
    ``QueueTracing.running`` (the CONSUMER span, its parent from ``traceparent``)."""
    from spanner_queues.contrib.tracing import QueueTracing
    from spanner_queues.message import Message
    from tests.tracingapp.models import Events, RawEvents

    tracing = QueueTracing()
    with tracing.sending("tracingapp.Events", 1) as scope:
        carrier = dict(scope.carrier)
    Events.replace(id="probe", payload={"order": 7, "note": "x" * 64})
    stored = Events.objects.filter(pk="probe").values_list("payload", flat=True).get()
    fields = json.loads(stored) if isinstance(stored, str) else stored
    event = json.dumps({**fields, **carrier})
    raw = b'{"note":"' + b"x" * 64 + b'","order":7}'

    def fresh(queue: str, payload: bytes) -> Message:
        return Message(queue=queue, key=("k",), key_names=("id",), payload=payload,
                       deliver_time=None)  # fmt: skip

    result = {}
    for name, label, payload, traced in (
        ("raw", RawEvents._meta.label, raw, False),
        ("envelope", Events._meta.label, event.encode(), False),
        ("envelope+tracing", Events._meta.label, event.encode(), True),
    ):
        started = time.perf_counter()
        for _ in range(messages):
            message = fresh(label, payload)
            if traced:
                with tracing.running("bench", [message]):
                    message.json()
            else:
                message.json()
        result[name] = (time.perf_counter() - started) / messages * 1e6
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=500)
    args = parser.parse_args()
    from benchmarks.core import _setup

    with tempfile.TemporaryDirectory(prefix="sq-tracing-") as workdir:
        info = _setup("sqlite", workdir)
        _sdk()
        _round("raw", 50)  # warm up: imports, statements, the receiver's first run
        _round("envelope+tracing", 50)
        samples: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for mode in MODES:
                samples[mode].append(_round(mode, args.messages))
        overhead = [_consumer_overhead(args.messages * 4) for _ in range(args.rounds)]
    result: dict[str, Any] = {"info": info, "rounds": args.rounds, "messages": args.messages}
    print(f"{info['database']}, {args.rounds} rounds x {args.messages} messages, median us/msg")
    print(f"{'mode':<18} {'send':>8} {'worker run':>11} {'receive side':>13}")
    for mode in MODES:
        send = statistics.median(s for s, _ in samples[mode])
        run = statistics.median(r for _, r in samples[mode])
        side = statistics.median(o[mode] for o in overhead)
        result[mode] = {"send_us": round(send, 1), "run_us": round(run, 1)}
        result[mode]["receive_side_us"] = round(side, 1)
        print(f"{mode:<18} {send:>8.1f} {run:>11.1f} {side:>13.1f}")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()

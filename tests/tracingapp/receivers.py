"""Receivers of the process tests (``tests/tracing/test_worker_process.py``): each run writes
a ``Ran`` row with its trace context; ``{"fail": ...}`` raises."""

from __future__ import annotations

import json

from spanner_queues import receiver
from spanner_queues.message import Message
from tests.tracingapp.models import Ran


@receiver("tracingapp.Events")
def record(message: Message) -> None:
    data = message.json()
    if isinstance(data, dict) and data.get("fail"):
        raise RuntimeError(data["fail"])
    from opentelemetry import trace  # (here: this module is imported without the SDK too)

    context = trace.get_current_span().get_span_context()
    Ran.objects.create(
        queue=message.queue,
        key=message.key[0],
        data=json.dumps({"trace_id": f"{context.trace_id:032x}", "event": message.event}),
    )

"""The tracing app's spans in one process: a PRODUCER span per send in the caller's span, a
CONSUMER span per receiver run in the trace of the send (envelope queues), errors and ``Retry``
on it, the outbox's sends in the saving code's trace, ids in the worker's log records, and a raw
queue's runs linked to nothing. The OpenTelemetry SDK exports to memory (``conftest``)."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from django.db import transaction
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from spanner_queues.contrib.tracing import MESSAGING_SYSTEM
from spanner_queues.exceptions import Retry
from spanner_queues.receivers import ReceiverRegistry, receiver
from spanner_queues.worker import Worker
from tests.tracingapp.models import Events, Order, RawEvents

pytestmark = pytest.mark.django_db(transaction=True)

tracer = trace.get_tracer("tests")


def run_worker(queue: str, func, **options) -> None:
    registry = ReceiverRegistry()
    receiver(queue, registry=registry, **options)(func)
    Worker([queue], registry=registry, burst=True, install_signal_handlers=False).run()


def named(spans, name: str) -> list:
    return [s for s in spans.get_finished_spans() if s.name == name]


def stored_event(model, key: str) -> dict:
    value = model.objects.filter(pk=key).values_list("payload", flat=True).get()
    return json.loads(value if isinstance(value, (str, bytes)) else json.dumps(value))


def test_a_send_is_a_producer_span_in_the_callers_span_and_the_event_carries_it(spans) -> None:
    with tracer.start_as_current_span("request") as request:
        Events.send(id="p1", payload={"n": 1})
    [send] = named(spans, "send tracingapp.Events")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent.span_id == request.get_span_context().span_id
    assert dict(send.attributes) == {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "tracingapp.Events",
        "messaging.message.id": "p1",
    }
    ctx = send.context
    assert stored_event(Events, "p1")["traceparent"] == (
        f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    )


def test_the_worker_runs_a_message_in_a_consumer_span_child_of_its_send(spans) -> None:
    with tracer.start_as_current_span("request"):
        Events.send(id="c1", payload={"n": 1}, event={"type": "t.one", "subject": "s"})
    seen = []

    def handle(message):
        seen.append(trace.get_current_span().get_span_context())

    run_worker("tracingapp.Events", handle)
    [send] = named(spans, "send tracingapp.Events")
    [process] = named(spans, "process tracingapp.Events")
    assert process.kind is SpanKind.CONSUMER
    assert process.context.trace_id == send.context.trace_id
    assert process.parent.span_id == send.context.span_id
    assert seen == [process.context]  # current while the receiver runs
    attributes = dict(process.attributes)
    assert attributes["messaging.system"] == MESSAGING_SYSTEM
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == "tracingapp.Events"
    assert attributes["messaging.message.id"] == "c1"
    assert (attributes["cloudevents.event_type"], attributes["cloudevents.event_subject"]) == (
        "t.one",
        "s",
    )
    assert process.status.status_code is StatusCode.UNSET


def test_a_failing_receivers_error_is_on_its_span(spans) -> None:
    Events.send(id="f1", payload={})

    def fail(message):
        raise ValueError("no stock for order 7")

    run_worker("tracingapp.Events", fail)
    [process] = named(spans, "process tracingapp.Events")
    assert process.status.status_code is StatusCode.ERROR
    assert "no stock for order 7" in process.status.description
    assert process.attributes["error.type"] == "ValueError"
    [exception] = [e for e in process.events if e.name == "exception"]
    assert exception.attributes["exception.type"] == "ValueError"


def test_a_retry_is_recorded_and_the_next_run_stays_in_the_trace_of_the_send(spans) -> None:
    with tracer.start_as_current_span("request"):
        Events.send(id="r1", payload={})
    runs = []

    def once_more(message):
        runs.append(message)
        if len(runs) == 1:
            raise Retry(after=timedelta(0))

    run_worker("tracingapp.Events", once_more)
    [send] = named(spans, "send tracingapp.Events")
    first, second = named(spans, "process tracingapp.Events")
    assert [e.attributes["exception.type"] for e in first.events] == [
        "spanner_queues.exceptions.Retry"
    ]
    assert first.status.status_code is StatusCode.UNSET
    assert {first.parent.span_id, second.parent.span_id} == {send.context.span_id}


def test_a_raw_queue_carries_no_context_and_its_runs_link_nothing(spans) -> None:
    with tracer.start_as_current_span("request") as request:
        RawEvents.send(id="raw", payload={"n": 1})
    assert stored_event(RawEvents, "raw") == {"n": 1}  # the user's payload untouched
    run_worker("tracingapp.RawEvents", lambda m: None)
    [process] = named(spans, "process tracingapp.RawEvents")
    assert process.parent is None and not process.links
    assert process.context.trace_id != request.get_span_context().trace_id


def test_a_batch_run_links_to_each_messages_send(spans) -> None:
    for i in range(3):
        with tracer.start_as_current_span(f"request {i}"):
            Events.send(id=f"b{i}", payload={})

    def handle(messages):
        pass

    registry = ReceiverRegistry()
    receiver("tracingapp.Events", registry=registry, batch=True)(handle)
    Worker(
        ["tracingapp.Events"],
        registry=registry,
        burst=True,
        batch_size=10,
        install_signal_handlers=False,
    ).run()
    sends = {s.context.span_id for s in named(spans, "send tracingapp.Events")}
    processes = named(spans, "process tracingapp.Events")
    linked = {link.context.span_id for p in processes for link in p.links}
    assert linked == sends
    assert sum(p.attributes.get("messaging.batch.message_count", 1) for p in processes) == 3


def test_an_outbox_save_sends_in_the_trace_of_the_saving_code(spans) -> None:
    with tracer.start_as_current_span("request") as request:
        with transaction.atomic():
            order = Order.objects.create(total=3)
    [send] = named(spans, "send tracingapp.OrderEvents")
    assert send.context.trace_id == request.get_span_context().trace_id
    run_worker("tracingapp.OrderEvents", lambda m: None)
    [process] = named(spans, "process tracingapp.OrderEvents")
    assert process.context.trace_id == request.get_span_context().trace_id
    assert process.attributes["cloudevents.event_subject"] == str(order.pk)


def test_worker_log_records_carry_the_trace_and_span_ids(spans, caplog) -> None:
    Events.send(id="l1", payload={})
    caplog.set_level(logging.DEBUG, logger="spanner_queues.worker")
    run_worker("tracingapp.Events", lambda m: None)
    [process] = named(spans, "process tracingapp.Events")
    [acked] = [r for r in caplog.records if getattr(r, "action", None) == "acked"]
    assert acked.trace_id == f"{process.context.trace_id:032x}"
    assert acked.span_id == f"{process.context.span_id:016x}"

"""With ``opentelemetry-instrumentation-django`` the request's SERVER span is the parent of the
sends made in the view (``Queue.send`` and the outbox's), and the worker's runs are in its
trace."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from django.test import Client
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.trace import SpanKind

from spanner_queues.envelope import TRACESTATE_BUDGET
from spanner_queues.receivers import ReceiverRegistry, receiver
from spanner_queues.worker import Worker
from tests.tracingapp.models import Events

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.tracingapp.urls")]


@pytest.fixture
def instrumented() -> Iterator[None]:
    DjangoInstrumentor().instrument()
    try:
        yield
    finally:
        DjangoInstrumentor().uninstrument()


def test_the_request_span_is_the_parent_of_its_sends_and_their_runs(spans, instrumented) -> None:
    assert Client().get("/orders/7/pay").content == b"paid"
    [request] = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    sends = [s for s in spans.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    assert sorted(s.name for s in sends) == [
        "send tracingapp.Events",
        "send tracingapp.OrderEvents",
    ]
    assert {s.parent.span_id for s in sends} == {request.context.span_id}

    registry = ReceiverRegistry()
    for queue in ("tracingapp.Events", "tracingapp.OrderEvents"):
        receiver(queue, registry=registry)(lambda message: None)
    Worker(
        ["tracingapp.Events", "tracingapp.OrderEvents"],
        registry=registry,
        burst=True,
        install_signal_handlers=False,
    ).run()
    runs = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert len(runs) == 2
    assert {r.context.trace_id for r in runs} == {request.context.trace_id}


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _stored_event(key: str) -> dict:
    row = Events.objects.filter(pk=key).values_list("payload", flat=True).get()
    return json.loads(bytes(row) if isinstance(row, (bytes, memoryview)) else row)


def test_a_large_incoming_tracestate_neither_fails_the_send_nor_eats_its_payload(
    spans, instrumented
) -> None:
    # 32 entries of 240 characters: valid, under OpenTelemetry's 8,192 (before: HTTP 500,
    # PayloadTooLarge, 8,112 > 4,096 bytes, nothing stored)
    huge = ",".join(f"v{i:02}={'x' * 236}" for i in range(32))
    response = Client().get("/orders/8/pay", HTTP_TRACEPARENT=TRACEPARENT, HTTP_TRACESTATE=huge)
    assert response.content == b"paid"
    event = _stored_event("pay-8")
    assert event["traceparent"].split("-")[1] == TRACEPARENT.split("-")[1]  # the same trace
    assert "tracestate" not in event  # W3C: entries over 128 characters go first


def test_a_tracestate_is_kept_from_its_start_within_the_envelope_budget(
    spans, instrumented
) -> None:
    entries = [f"k{i:02}={'y' * 60}" for i in range(32)]  # 64 characters each, 2,079 in all
    response = Client().get(
        "/orders/9/pay", HTTP_TRACEPARENT=TRACEPARENT, HTTP_TRACESTATE=",".join(entries)
    )
    assert response.content == b"paid"
    kept = _stored_event("pay-9")["tracestate"]
    assert len(kept) <= TRACESTATE_BUDGET
    assert kept == ",".join(entries[: len(kept.split(","))])  # dropped from the end (right)
    assert len(kept.split(",")) == (TRACESTATE_BUDGET + 1) // 65

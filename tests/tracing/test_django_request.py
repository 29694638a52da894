"""With ``opentelemetry-instrumentation-django`` the request's SERVER span is the parent of the
sends made in the view (``Queue.send`` and the outbox's), and the worker's runs are in its
trace."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.trace import SpanKind

from spanner_queues.receivers import ReceiverRegistry, receiver
from spanner_queues.worker import Worker

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

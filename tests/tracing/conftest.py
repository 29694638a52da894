"""The OpenTelemetry SDK for the tracing tests: one global tracer provider for the session
(OpenTelemetry sets it once per process) exporting to memory, and the tracing app's
instrumentation installed for the test that asks for ``spans``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def _exporter() -> Any:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


@pytest.fixture
def spans(_exporter: Any) -> Iterator[Any]:
    """The in-memory exporter (``get_finished_spans()``), emptied, with ``QueueTracing``
    installed for the test."""
    from spanner_queues import instrumentation
    from spanner_queues.contrib.tracing import QueueTracing

    _exporter.clear()
    instrumentation.install(QueueTracing())
    try:
        yield _exporter
    finally:
        instrumentation.install(None)
        _exporter.clear()

"""OpenTelemetry tracing for spanner_queues: an optional app (label ``spanner_queues_tracing``).

    pip install 'spanner-queues[tracing]'
    INSTALLED_APPS += ["spanner_queues.contrib.tracing"]

It depends on ``opentelemetry-api`` only and uses the global tracer provider and propagator
you configure (the SDK, an exporter), as every OpenTelemetry instrumentation does. Installed,
it gives each send a PRODUCER span (``send <queue label>``) in the caller's active span and
each receiver run a CONSUMER span (``process <queue label>``): on an envelope queue
(``QueueMeta.envelope = "cloudevents"``) the message carries the send's context
(``traceparent``/``tracestate`` of its event), so the run is a child of the send in the same
trace, across processes. Raw payload queues carry no context: their runs start a new trace
and link nothing. Not installed, nothing of it is imported and the verbs call nothing.

See ``docs/howto/tracing.md`` (names and attributes: ``spanner_queues.contrib.tracing.otel``).
The public names, from here::

    from spanner_queues.contrib.tracing import MESSAGING_SYSTEM, QueueTracing
"""

from __future__ import annotations

from spanner_queues.contrib.tracing.otel import MESSAGING_SYSTEM, QueueTracing

__all__ = ["MESSAGING_SYSTEM", "QueueTracing"]

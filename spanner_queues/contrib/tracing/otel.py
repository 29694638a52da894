"""The OpenTelemetry side: spans per the messaging semantic conventions.

Spans (``messaging.system`` is ``gcp_spanner``: the conventions name no value for Spanner; it
follows their ``gcp_pubsub``):

- ``send <queue label>`` (PRODUCER), one per ``send``/``send_many`` call and per outbox write:
  ``messaging.operation.type``/``.name`` ``send``, ``messaging.destination.name`` (the label),
  ``messaging.message.id`` (the key, as text) for one message or
  ``messaging.batch.message_count`` for more.
- ``process <queue label>`` (CONSUMER), one per receiver run: ``messaging.operation.type``
  ``process``, ``messaging.operation.name`` (the receiver), the destination, the message id,
  ``messaging.gcp_spanner.message.delivery_attempt``, and on an envelope queue
  ``cloudevents.event_id``/``event_type``/``event_source``/``event_subject``. Its parent is the
  send's context stored in the message (one message), or it links to each message's (a batch).
  An error is recorded on it (``exception`` event, status ERROR, ``error.type``); a ``Retry``
  is recorded as an ``exception`` event with status left unset (the run did what it meant to).

Worker log records about a message carry ``trace_id`` and ``span_id`` (hex) of its last
``process`` span in this process (a bounded table, ``RECENT`` entries).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from spanner_queues.exceptions import Retry

if TYPE_CHECKING:
    from spanner_queues.message import Message

__all__ = ["MESSAGING_SYSTEM", "QueueTracing"]

MESSAGING_SYSTEM = "gcp_spanner"
#: the (queue, key) -> (trace id, span id) entries kept for the worker's log records
RECENT = 4096
_TRACE_KEYS = ("traceparent", "tracestate")


class _SendScope:
    __slots__ = ("carrier", "span")

    def __init__(self, span: trace.Span, carrier: Mapping[str, str]) -> None:
        self.span = span
        self.carrier = carrier

    def sent(self, messages: Sequence[Message]) -> None:
        if len(messages) == 1 and self.span.is_recording():
            self.span.set_attribute("messaging.message.id", _message_id(messages[0]))


def _message_id(message: Message) -> str:
    return ",".join(str(v) for v in message.key)


class QueueTracing:
    """The instrumentation the app installs (``spanner_queues.instrumentation``); the tracer is
    the global provider's, read on each span so a provider configured later is used."""

    def __init__(self) -> None:
        self._recent: OrderedDict[tuple[str, tuple[Any, ...]], tuple[str, str]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _tracer() -> trace.Tracer:
        return trace.get_tracer("spanner_queues.contrib.tracing")

    @contextmanager
    def sending(self, queue: str, count: int) -> Iterator[_SendScope]:
        attributes: dict[str, Any] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": queue,
        }
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        with self._tracer().start_as_current_span(
            f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            yield _SendScope(span, self.carrier())

    def carrier(self) -> Mapping[str, str]:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return {k: carrier[k] for k in _TRACE_KEYS if k in carrier}

    @contextmanager
    def running(self, receiver: str, messages: Sequence[Message]) -> Iterator[trace.Span]:
        first = messages[0]
        attributes: dict[str, Any] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": receiver,
            "messaging.destination.name": first.queue,
        }
        parent = None
        links: list[Link] = []
        if len(messages) == 1:
            attributes["messaging.message.id"] = _message_id(first)
            # (an attempt not known yet is not read: on a native queue that costs a read)
            attempt = first.__dict__.get("_attempt")
            if isinstance(attempt, int):
                attributes["messaging.gcp_spanner.message.delivery_attempt"] = attempt
            event = first.event
            if event is not None:
                for name in ("id", "type", "source", "subject"):
                    if name in event:
                        attributes[f"cloudevents.event_{name}"] = event[name]
                parent = _context_of(event)
        else:
            attributes["messaging.batch.message_count"] = len(messages)
            for m in messages:
                context = _context_of(m.event)
                if context is not None:
                    span_context = trace.get_current_span(context).get_span_context()
                    links.append(Link(span_context))
        with self._tracer().start_as_current_span(
            f"process {first.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            self._remember(messages, span)
            try:
                yield span
            except Retry as exc:
                span.record_exception(exc)
                raise
            except BaseException as exc:
                span.record_exception(exc)
                span.set_attribute("error.type", _type_name(exc))
                span.set_status(Status(StatusCode.ERROR, str(exc) or type(exc).__name__))
                raise

    def _remember(self, messages: Sequence[Message], span: trace.Span) -> None:
        context = span.get_span_context()
        if not context.is_valid:
            return
        ids = (trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id))
        with self._lock:
            for m in messages:
                key = (m.queue, m.key)
                self._recent[key] = ids
                self._recent.move_to_end(key)
            while len(self._recent) > RECENT:
                self._recent.popitem(last=False)

    def log_fields(self, message: Message) -> Mapping[str, Any]:
        with self._lock:
            ids = self._recent.get((message.queue, message.key))
        if ids is None:
            return {}
        return {"trace_id": ids[0], "span_id": ids[1]}


def _type_name(exc: BaseException) -> str:
    """The exception's fully-qualified class name (builtins by their name alone)."""
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _context_of(event: Mapping[str, Any] | None) -> Any:
    """The OpenTelemetry context stored in an event, or None."""
    if not event or "traceparent" not in event:
        return None
    carrier = {k: str(event[k]) for k in _TRACE_KEYS if k in event}
    context = propagate.extract(carrier)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context

"""The hook through which an optional app (``spanner_queues.contrib.tracing``) observes sends
and receiver runs. While none is installed (``installed`` is None) the verbs and the worker
call nothing: the cost is one module attribute read per send and per run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from spanner_queues.message import Message


class SendScope(Protocol):
    """One send (``send``/``send_many``, the outbox's), open while its messages are built and
    written."""

    #: the trace context an envelope queue stores with each message (``traceparent``, ...)
    carrier: Mapping[str, str]

    def sent(self, messages: Sequence[Message]) -> None:
        """The messages written (before commit)."""


class Instrumentation(Protocol):
    def sending(self, queue: str, count: int) -> AbstractContextManager[SendScope]:
        """Around one send of ``count`` messages to ``queue`` (a label); an error raised in it
        propagates through it."""

    def carrier(self) -> Mapping[str, str]:
        """The trace context of the caller now (a message built outside ``sending``)."""

    def running(self, receiver: str, messages: Sequence[Message]) -> AbstractContextManager[Any]:
        """Around one receiver call on ``messages``; its error (``Retry`` too) propagates
        through it."""

    def log_fields(self, message: Message) -> Mapping[str, Any]:
        """Extra fields for the worker's log records about ``message``."""


#: the installed instrumentation (one per process), or None
installed: Instrumentation | None = None


def install(instrumentation: Instrumentation | None) -> None:
    """Install ``instrumentation`` (None: remove it)."""
    global installed
    installed = instrumentation

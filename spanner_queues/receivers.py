"""Receivers: functions the worker calls with received messages.

    from spanner_queues import receiver, Retry

    @receiver(UserTasks)
    def send_welcome(message):
        ...

Receivers live in a ``receivers`` module of an installed app; ``SpannerQueuesConfig.ready()``
imports those modules (like ``admin.py``). Options of ``@receiver``:

- ``atomic=True`` (default): the receiver runs inside a transaction on the queue's database
  that also acks the message; its database writes and the ack commit together or not at all.
  ``atomic=False``: the receiver runs outside any transaction (for external side effects) and
  the worker acks afterwards in a transaction of its own.
- ``match={"field": value, ...}``: several receivers on one queue, chosen by key columns (a name
  that is a key field of the queue) or by top-level fields of a JSON payload (any other name).
  A queue may also have one receiver without ``match``: it takes every message no other one
  matches.
- ``batch=True``: the receiver takes a list of messages (up to ``max_batch_size``) and the whole
  batch is acked in one transaction (with the receiver's writes when ``atomic``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from spanner_queues.exceptions import PayloadError, QueueConfigurationError, QueueError
from spanner_queues.keys import key_fields
from spanner_queues.message import Message
from spanner_queues.registry import get_queue

if TYPE_CHECKING:
    from spanner_queues.models import Queue

__all__ = [
    "NoReceiver",
    "ReceiverConfigurationError",
    "ReceiverRegistry",
    "ReceiverSpec",
    "receiver",
    "receivers",
]


class ReceiverConfigurationError(QueueConfigurationError):
    """A receiver is declared wrongly: unknown queue, clashing ``match``, mixed batch kinds."""


class NoReceiver(QueueError):
    """No receiver of the queue matches this message (it is handled as a failure)."""


class MessageReceiver(Protocol):
    def __call__(self, message: Message, /) -> Any: ...


class BatchReceiver(Protocol):
    def __call__(self, messages: list[Message], /) -> Any: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiverSpec:
    """One registered receiver. ``queue`` is the model or label given to ``@receiver``."""

    func: Callable[..., Any]
    queue: str | type[Queue]
    name: str
    atomic: bool = True
    match: Mapping[str, Any] = field(default_factory=dict)
    batch: bool = False
    max_batch_size: int | None = None
    #: time limit in seconds (None: the worker's ``timeout``)
    timeout: float | None = None

    @property
    def model(self) -> type[Queue]:
        """The queue model; ``UnknownQueue`` if the queue is not declared."""
        return get_queue(self.queue)

    def split_match(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``match`` split into (key attname -> value, payload field -> value)."""
        names: dict[str, str] = {}
        for f in key_fields(self.model):
            names[f.name] = f.attname
            names[f.attname] = f.attname
        on_key = {names[k]: v for k, v in self.match.items() if k in names}
        on_payload = {k: v for k, v in self.match.items() if k not in names}
        return on_key, on_payload

    def matches(self, message: Message) -> bool:
        """Whether this receiver takes ``message`` (always, without ``match``)."""
        if not self.match:
            return True
        on_key, on_payload = self.split_match()
        key = message.key_dict
        if any(key.get(name) != value for name, value in on_key.items()):
            return False
        if on_payload:
            try:
                data = message.json()
            except PayloadError:
                return False
            if not isinstance(data, Mapping):
                return False
            return all(name in data and data[name] == v for name, v in on_payload.items())
        return True


class ReceiverRegistry:
    """Receivers by queue. ``receivers`` is the one the decorator and the worker use."""

    def __init__(self) -> None:
        self._specs: dict[tuple[str, str], ReceiverSpec] = {}
        self._lock = threading.Lock()
        #: periodic schedules (``spanner_queues.patterns.periodic``), seeded by the worker.
        self.schedules: dict[tuple[str, str], Any] = {}

    def register(self, spec: ReceiverSpec) -> ReceiverSpec:
        """Add ``spec``; the same function registered again for the same queue replaces it
        (a module imported twice registers nothing new)."""
        with self._lock:
            self._specs[(spec.name, _queue_id(spec.queue))] = spec
        return spec

    def unregister(self, name: str) -> None:
        with self._lock:
            for identity in [i for i in self._specs if i[0] == name]:
                del self._specs[identity]

    def all(self) -> list[ReceiverSpec]:
        with self._lock:
            return list(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def by_queue(self) -> dict[str, list[ReceiverSpec]]:
        """Receivers grouped by queue label; raise ``ReceiverConfigurationError`` for any
        receiver whose queue is not declared or whose receivers clash."""
        grouped: dict[str, list[ReceiverSpec]] = {}
        for spec in self.all():
            try:
                label = spec.model._meta.label
            except QueueError as exc:
                raise ReceiverConfigurationError(
                    f"Receiver {spec.name} is registered for {spec.queue!r}, which is not a "
                    f"declared queue: {exc}"
                ) from exc
            grouped.setdefault(label, []).append(spec)
        for label, specs in grouped.items():
            _validate_queue_receivers(label, specs)
        return grouped

    def for_queue(self, queue: str | type[Queue]) -> list[ReceiverSpec]:
        """The receivers of one queue (validated); empty when it has none."""
        label = get_queue(queue)._meta.label
        return self.by_queue().get(label, [])

    def route(self, specs: Sequence[ReceiverSpec], message: Message) -> ReceiverSpec:
        """The receiver for ``message``: the first matching one with ``match``, else the
        queue's catch-all; ``NoReceiver`` if none."""
        fallback = None
        for spec in specs:
            if not spec.match:
                fallback = spec
            elif spec.matches(message):
                return spec
        if fallback is not None:
            return fallback
        raise NoReceiver(f"{message}: no receiver of {message.queue} matches this message.")


def _validate_queue_receivers(label: str, specs: list[ReceiverSpec]) -> None:
    catch_all = [s.name for s in specs if not s.match]
    if len(catch_all) > 1:
        raise ReceiverConfigurationError(
            f"{label} has {len(catch_all)} receivers without match= ({', '.join(catch_all)}); "
            "give each a match={...} on a key column or payload field."
        )
    seen: dict[tuple, str] = {}
    for spec in specs:
        if spec.match:
            identity = tuple(sorted((k, repr(v)) for k, v in spec.match.items()))
            if identity in seen:
                raise ReceiverConfigurationError(
                    f"{label}: receivers {seen[identity]} and {spec.name} have the same "
                    f"match={dict(spec.match)!r}."
                )
            seen[identity] = spec.name
    if len({s.batch for s in specs}) > 1:
        raise ReceiverConfigurationError(
            f"{label} mixes batch and single-message receivers; use one kind per queue."
        )


def _queue_id(queue: str | type[Queue]) -> str:
    return queue if isinstance(queue, str) else f"{queue.__module__}.{queue.__qualname__}"


receivers = ReceiverRegistry()


def receiver(
    queue: str | type[Queue],
    *,
    atomic: bool = True,
    match: Mapping[str, Any] | None = None,
    batch: bool = False,
    max_batch_size: int | None = None,
    timeout: float | None = None,
    registry: ReceiverRegistry | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as a receiver of ``queue`` (a model or its label).

    ``timeout``: its time limit in seconds (default: the worker's ``--timeout``): past it the
    run is interrupted and counts as a failed attempt (``spanner_queues.worker.limits``).
    The function is returned unchanged, so it can still be called directly in tests.
    """
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < float("inf")
    ):
        raise ReceiverConfigurationError(
            f"timeout must be a positive number of seconds, not {timeout!r}."
        )
    if max_batch_size is not None and (not isinstance(max_batch_size, int) or max_batch_size < 1):
        raise ReceiverConfigurationError("max_batch_size must be a positive int.")
    if max_batch_size is not None and not batch:
        raise ReceiverConfigurationError("max_batch_size needs batch=True.")

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        name = f"{func.__module__}.{func.__qualname__}"
        (registry if registry is not None else receivers).register(
            ReceiverSpec(
                func=func,
                queue=queue,
                name=name,
                atomic=atomic,
                match=dict(match or {}),
                batch=batch,
                max_batch_size=max_batch_size,
                timeout=float(timeout) if timeout is not None else None,
            )
        )
        return func

    return decorator


# --- what the receiver's own code did with the message -----------------------------------
_local = threading.local()


def _pending() -> set[tuple[str, tuple]] | None:
    return getattr(_local, "pending", None)


def set_pending(
    messages: Iterable[Message] | None,
    *,
    current: Callable[[Message], Message] | None = None,
) -> None:
    """Worker use: the messages the current thread's receiver is handling (None: none);
    ``current(message)`` gives the message with the lease the worker holds now (renewals
    rotate the token while the receiver runs)."""
    _local.pending = None if messages is None else {(m.queue, m.key) for m in messages}
    _local.current = current if messages is not None else None
    _local.acked = set()


def held_lease_token(message: Message) -> str | None:
    """The lease token to ack ``message`` with: the worker's current one while the running
    receiver handles it (renewals rotate it), else the message's own."""
    pending = _pending()
    current = getattr(_local, "current", None)
    if current is not None and pending is not None and (message.queue, message.key) in pending:
        return current(message).lease_token
    return message.lease_token


def mark_acked(message: Message) -> None:
    """Record that the running receiver acked ``message`` itself (the pattern helpers call
    this), so that the worker does not ack it a second time."""
    pending = _pending()
    if pending is not None and (message.queue, message.key) in pending:
        _local.acked.add((message.queue, message.key))


def acked_by_receiver(message: Message) -> bool:
    """Worker use: whether the receiver's code acked ``message`` (via a pattern helper)."""
    return (message.queue, message.key) in getattr(_local, "acked", set())


def handled_by_running_receiver(message: Message) -> bool:
    """Whether ``message`` is one the current thread's running receiver was handed by the
    worker (which then reports it acked, or not, itself)."""
    pending = _pending()
    return pending is not None and (message.queue, message.key) in pending

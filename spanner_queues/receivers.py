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
- ``takes_context=True``: the receiver is called with a ``MessageContext`` first
  (``def r(context, message)``), as Django's ``@task(takes_context=True)`` is with its
  ``TaskContext``: its messages, receiver, worker, time left and the lease held now.

While the worker runs a receiver, the run's ``MessageContext`` is also the value of a
``contextvars.ContextVar``: the verbs (``api.ack``, ``api.requeue``...) and the pattern helpers
called by the receiver's code find it there, ack with the lease the worker holds now, and tell
the worker not to ack those messages again. Code the receiver runs in another thread *with its
context* (``asyncio.to_thread``, ``contextvars.copy_context().run``) belongs to the run; a
thread started without it does not, and a context that outlives its run is inert.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from django.db import transaction

from spanner_queues import instrumentation
from spanner_queues.exceptions import Cancelled, PayloadError, QueueConfigurationError, QueueError
from spanner_queues.keys import key_fields
from spanner_queues.message import Message
from spanner_queues.queues import get_queue

if TYPE_CHECKING:
    from spanner_queues.models import Queue

__all__ = [
    "MessageContext",
    "NoReceiver",
    "ReceiverConfigurationError",
    "ReceiverRegistry",
    "ReceiverSpec",
    "current_run",
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
    #: a single-message receiver's time limit for one message, read from the message (None
    #: from it: ``timeout``); the Tasks runner's, for a task's own ``timeout``
    timeout_of: Callable[[Message], float | None] | None = None
    #: called as ``func(context, message_or_messages)`` with a ``MessageContext``
    takes_context: bool = False
    #: whether its runs may share one transaction and commit with other messages' (the
    #: worker's groups, ``worker.group``): None: when ``atomic``; False: always alone; True on
    #: a non-atomic receiver: its own transactions nest in the group's (savepoints)
    group: bool | None = None
    #: ``split_match``'s answer, made at its first call (the key columns do not change)
    _split: tuple[dict[str, Any], dict[str, Any]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @property
    def model(self) -> type[Queue]:
        """The queue model; ``UnknownQueue`` if the queue is not declared."""
        return get_queue(self.queue)

    def split_match(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``match`` split into (key attname -> value, payload field -> value); worked out
        once per receiver (it runs for every message the worker routes)."""
        if self._split is not None:
            return self._split
        names: dict[str, str] = {}
        for f in key_fields(self.model):
            names[f.name] = f.attname
            names[f.attname] = f.attname
        on_key = {names[k]: v for k, v in self.match.items() if k in names}
        on_payload = {k: v for k, v in self.match.items() if k not in names}
        object.__setattr__(self, "_split", (on_key, on_payload))  # (frozen: set once)
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
    takes_context: bool = False,
    group: bool | None = None,
    registry: ReceiverRegistry | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as a receiver of ``queue`` (a model or its label).

    ``timeout``: its time limit in seconds (default: the worker's ``--timeout``): past it the
    run is interrupted and counts as a failed attempt (``spanner_queues.worker.limits``).
    ``takes_context``: call it as ``func(context, message)`` (batches: ``func(context,
    messages)``) with the run's ``MessageContext``.
    ``group``: whether the worker may run it in one transaction with other messages' receivers
    (group commit; default: when ``atomic``); ``group=False`` runs each message alone.
    The function is returned unchanged, so it can still be called directly in tests.
    """
    if not isinstance(takes_context, bool):
        raise ReceiverConfigurationError(f"takes_context must be a bool, not {takes_context!r}.")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < float("inf")
    ):
        raise ReceiverConfigurationError(
            f"timeout must be a positive number of seconds, not {timeout!r}."
        )
    if group is not None and not isinstance(group, bool):
        raise ReceiverConfigurationError(f"group must be a bool or None, not {group!r}.")
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
                takes_context=takes_context,
                group=group,
            )
        )
        return func

    return decorator


# --- the run of a receiver, as its code sees it ----------------------------------------------


class GroupRows:
    """The rows the runs of one attempt of a group handed it (``MessageContext.write_with_group``),
    by key, each with the run that handed it: written by one call a key before the group's
    ack (``worker.group``); a run that failed has its rows dropped."""

    __slots__ = ("_by_key",)

    def __init__(self) -> None:
        self._by_key: dict[Hashable, tuple[Callable[[list[Any]], None], list[tuple[Any, Any]]]] = {}

    def take(
        self,
        context: MessageContext,
        key: Hashable,
        row: Any,
        write: Callable[[list[Any]], None],
    ) -> None:
        """``row`` from ``context``'s run, to be written by ``write`` with the others of ``key``."""
        entry = self._by_key.get(key)
        if entry is None:
            entry = self._by_key[key] = (write, [])
        entry[1].append((context, row))

    def drop(self, context: MessageContext) -> None:
        """Forget the rows of ``context``'s run (it failed: its writes rolled back)."""
        for _write, rows in self._by_key.values():
            rows[:] = [(c, row) for c, row in rows if c is not context]

    def write(self) -> None:
        """Write the rows handed so far: one call of each key's ``write``."""
        for write, rows in self._by_key.values():
            if rows:
                write([row for _context, row in rows])


class MessageContext:
    """One run of a receiver by the worker (or by the test kit's ``drain``), handed to
    receivers declared with ``takes_context=True`` and bound, for the run, to a
    ``contextvars.ContextVar`` that the verbs read (see the module docstring).

    Guarantees: ``messages`` are the ones the receiver was handed, as handed (their lease as
    received); ``lease(m)`` is ``m`` with the lease the worker holds now (renewals rotate the
    token while the receiver runs); ``acked(m)`` says whether the receiver's code acked ``m``
    in this attempt of its transaction (a retried transaction starts again). Once the run is
    over (``active`` False) the context is inert: ``lease(m)`` is ``m`` and nothing is
    recorded.
    """

    __slots__ = (
        "_acked",
        "_cancelled",
        "_committed",
        "_freeze",
        "_keys",
        "_peek",
        "_rides",
        "_stopping",
        "acks_in_transaction",
        "active",
        "deadline",
        "messages",
        "receiver",
        "started",
        "worker_id",
    )

    def __init__(
        self,
        receiver: ReceiverSpec,
        messages: Sequence[Message],
        *,
        worker_id: str | None = None,
        deadline: float | None = None,
        lease: Callable[[Message], Message] | None = None,
        freeze: Callable[[Message], Message] | None = None,
        stopping: Callable[[], bool] | None = None,
        acks_in_transaction: bool = False,
    ) -> None:
        #: the ``ReceiverSpec`` being run (its ``name``, ``queue``, ``atomic``, ...)
        self.receiver = receiver
        #: the messages handed to the receiver (one, or a batch)
        self.messages: tuple[Message, ...] = tuple(messages)
        #: the worker's id (``Worker.worker_id``; None outside a worker)
        self.worker_id = worker_id
        #: ``time.monotonic()`` past which the run is interrupted (None: no time limit)
        self.deadline = deadline
        #: True while the run lasts
        self.active = True
        #: whether the worker acks the messages once the receiver returns, in the transaction
        #: its writes commit in (an atomic receiver's, or a group's): code that would ack them
        #: itself with its writes (the Tasks runner) may leave the ack to it
        self.acks_in_transaction = acks_in_transaction
        #: ``time.monotonic()`` when the run began
        self.started = time.monotonic()
        self._keys = frozenset((m.queue, m.key) for m in self.messages)
        self._peek = lease
        self._freeze = freeze
        self._stopping = stopping
        self._acked: set[tuple[str, tuple]] = set()
        #: the messages whose ack by the receiver's code committed (on the database's commit)
        self._committed: set[tuple[str, tuple]] = set()
        #: set by the worker once an operator cancelled one of the messages (``api.cancel``)
        self._cancelled: Cancelled | None = None
        #: set by a group: takes the rows its runs hand it (``write_with_group``)
        self._rides: GroupRows | None = None

    def __repr__(self) -> str:
        state = "active" if self.active else "over"
        return f"<MessageContext {self.receiver.name} x{len(self.messages)} {state}>"

    @property
    def message(self) -> Message:
        """The message of a single-message receiver (a batch has none: see ``messages``)."""
        if len(self.messages) != 1 or self.receiver.batch:
            raise ReceiverConfigurationError(
                f"{self.receiver.name} is a batch receiver: use context.messages."
            )
        return self.messages[0]

    @property
    def attempt(self) -> int | None:
        """The delivery attempt of ``message`` (1 on the first delivery; None where the engine
        counts none)."""
        return self.message.attempt

    @property
    def queue(self) -> type[Queue]:
        """The queue model the messages came from."""
        return self.receiver.model

    def handles(self, message: Message) -> bool:
        """Whether ``message`` is one this run was handed, while the run lasts."""
        return self.active and (message.queue, message.key) in self._keys

    def lease(self, message: Message) -> Message:
        """``message`` with the lease the worker holds now (renewed), for a message of this
        run; any other message (or after the run) as it is."""
        if self._peek is not None and self.handles(message):
            return self._peek(message)
        return message

    def acked(self, message: Message) -> bool:
        """Whether the receiver's code acked ``message`` (``api.ack``, a pattern helper) in
        this attempt of the run."""
        return (message.queue, message.key) in self._acked

    def time_left(self) -> float | None:
        """Seconds left before the time limit interrupts the run (None: no limit)."""
        if self.deadline is None:
            return None
        return self.deadline - time.monotonic()

    def should_stop(self) -> bool:
        """Whether the worker is stopping (``stop()``, SIGTERM): a long receiver may then end
        early at a checkpoint (``patterns.checkpoint``) instead of running to its limit."""
        return self._stopping is not None and self._stopping()

    @property
    def cancelled(self) -> bool:
        """Whether an operator cancelled (``api.cancel``) a message of this run while it ran:
        the worker reads cancellations every ``controls.CANCEL_CHECK_SECONDS``. Cooperative: a
        receiver that never looks runs on to its end or its time limit."""
        return self._cancelled is not None

    def raise_if_cancelled(self) -> None:
        """Raise ``Cancelled`` (with the cancellation's ``reason`` and ``by``) if a message of
        this run was cancelled: the worker then acks the messages (not retried) and reports the
        run as cancelled; the receiver's transaction rolls back."""
        if self._cancelled is not None:
            raise Cancelled(self._cancelled.reason, self._cancelled.by)

    def _cancel(self, reason: str, by: str) -> None:
        """Worker use: an operator cancelled a message of this run."""
        if self._cancelled is None:
            self._cancelled = Cancelled(reason, by)

    def write_with_group(self, key: Hashable, row: Any, write: Callable[[list[Any]], None]) -> bool:
        """Worker use (the Tasks runner's result rows): in a group (``worker.group``), hand
        ``row`` to it instead of writing it now. The group writes the rows its runs handed it
        under one ``key`` with one call, ``write(rows)``, in its transaction, after its last
        receiver and before its ack (one statement for many rows); the rows of a run that
        fails are dropped with its other writes, and a group that runs again asks again.
        Returns False outside a group (or once the run is over): the caller writes ``row``
        itself."""
        if self._rides is None or not self.active:
            return False
        self._rides.take(self, key, row, write)
        return True

    # --- the verbs' side (through the ContextVar) --------------------------------------------

    def _held_token(self, message: Message) -> str | None:
        """The token to ack ``message`` with; from now on the worker no longer renews it."""
        if self._freeze is not None and self.handles(message):
            return self._freeze(message).lease_token
        return message.lease_token

    def committed(self, message: Message) -> bool:
        """Whether an ack of ``message`` by the receiver's code committed (its own transaction,
        or no transaction): the message is done whatever the run does next."""
        return (message.queue, message.key) in self._committed

    def _record_ack(self, messages: Iterable[Message], using: str | None = None) -> None:
        keys = [(m.queue, m.key) for m in messages if self.handles(m)]
        if not keys:
            return
        self._acked.update(keys)
        if using is not None:  # one callback for them all (at once outside a transaction)
            transaction.on_commit(partial(self._committed.update, keys), using=using)

    def _restart(self) -> None:
        """A retried transaction: the acks of the attempt before rolled back."""
        self._acked.clear()


#: the run of the receiver whose code is running in this context (None: none)
_running: contextvars.ContextVar[MessageContext | None] = contextvars.ContextVar(
    "spanner_queues_receiver_run", default=None
)


def current_run() -> MessageContext | None:
    """The run of the receiver whose code is running now (None: none): what a non-atomic
    receiver reads of the worker running it (``worker_id``, None under the test kit)."""
    return _running.get()


class running:
    """Worker (and test kit) use: bind ``context`` for the receiver's run; at exit the run is
    over everywhere its context was copied to. (A class, not a generator: entered once a
    message.)"""

    __slots__ = ("_context", "_token")

    def __init__(self, context: MessageContext) -> None:
        self._context = context

    def __enter__(self) -> MessageContext:
        self._token = _running.set(self._context)
        return self._context

    def __exit__(self, *exc: object) -> None:
        self._context.active = False
        _running.reset(self._token)


def call(spec: ReceiverSpec, context: MessageContext) -> Any:
    """Call the receiver as declared: with its context first when ``takes_context``."""
    arg: Any = list(context.messages) if spec.batch else context.messages[0]
    tracing = instrumentation.installed
    if tracing is None:
        return spec.func(context, arg) if spec.takes_context else spec.func(arg)
    with tracing.running(spec.name, context.messages):
        return spec.func(context, arg) if spec.takes_context else spec.func(arg)


def held_lease_token(message: Message) -> str | None:
    """The lease token to ack ``message`` with: the worker's current one while a running
    receiver handles it (renewals rotate it), else the message's own."""
    context = _running.get()
    return message.lease_token if context is None else context._held_token(message)


def mark_acked(message: Message | Iterable[Message], using: str | None = None) -> None:
    """Record that the running receiver acked ``message`` (or each of several) itself (the
    verbs and pattern helpers call this), so that the worker does not ack it a second time;
    with ``using``, the database of the ack, also when that ack commits
    (``MessageContext.committed``)."""
    context = _running.get()
    if context is not None:
        context._record_ack([message] if isinstance(message, Message) else message, using)


def handled_by_running_receiver(message: Message) -> bool:
    """Whether ``message`` is one the running receiver (in this context) was handed by the
    worker."""
    context = _running.get()
    return context is not None and context.handles(message)

"""The receiver's context: ``@receiver(takes_context=True)`` hands the receiver a
``MessageContext`` (its messages, receiver, worker, time limit, the lease held now), and the
verbs called by the receiver's code find the run they belong to through a ``ContextVar``, not a
thread-local: code the receiver runs in another thread with its context (``asyncio.to_thread``,
``contextvars.copy_context().run``) is part of the run, and a context that outlives its run is
inert."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction

from spanner_queues import api
from spanner_queues.engines import engine_for
from spanner_queues.message import Message
from spanner_queues.receivers import (
    MessageContext,
    ReceiverConfigurationError,
    ReceiverRegistry,
    handled_by_running_receiver,
    receiver,
)
from spanner_queues.worker import Worker, WorkerEvents
from tests.workerapp.models import WorkItemsDead

pytestmark = pytest.mark.django_db(transaction=True)
MakeWorker = Callable[..., Worker]


def _ack_in_this_thread(message: Message) -> None:
    try:
        with transaction.atomic(using=api._database(WorkItemsDead, None)):
            api.ack(message)
    finally:
        connections.close_all()  # this thread's connection, not left to the executor


def test_an_ack_from_a_thread_the_receiver_hands_its_context_to_is_not_acked_again(
    make_worker: MakeWorker,
) -> None:
    """A non-atomic receiver acks its message from a thread that runs in its context
    (``asyncio.to_thread`` copies it). The worker must know the message is acked: with a
    thread-local it did not, acked it a second time and reported it ``already_acked``."""
    registry = ReceiverRegistry()

    @receiver(WorkItemsDead, atomic=False, registry=registry)
    def hand_off(message: Message) -> None:
        async def main() -> None:
            await asyncio.to_thread(_ack_in_this_thread, message)

        asyncio.run(main())

    WorkItemsDead.send(id="a")
    stats = make_worker(WorkItemsDead, registry=registry, burst=True).run()
    assert (stats.processed, stats.failed) == (1, 0)
    assert stats.already_acked == 0
    assert not WorkItemsDead.objects.exists()


def test_takes_context_gets_the_runs_context(make_worker: MakeWorker) -> None:
    registry = ReceiverRegistry()
    seen: list[tuple[MessageContext, Message]] = []

    @receiver(WorkItemsDead, takes_context=True, timeout=30, registry=registry)
    def with_context(context: MessageContext, message: Message) -> None:
        seen.append((context, message))
        assert context.message is message and context.messages == (message,)
        assert context.lease(message).lease_token is not None or not message.lease_token
        assert not context.acked(message)
        left = context.time_left()
        assert left is not None and 0 < left <= 30
        assert not context.should_stop()

    WorkItemsDead.send(id="c")
    worker = make_worker(WorkItemsDead, registry=registry, burst=True, worker_id="w-ctx")
    assert worker.run().processed == 1
    [(context, message)] = seen
    assert context.receiver.name.endswith(".with_context")
    assert context.queue is WorkItemsDead
    assert context.worker_id == "w-ctx"
    assert context.attempt == message.attempt
    assert not context.active  # the run is over: the context is inert
    assert not WorkItemsDead.objects.exists()


def test_a_batch_receiver_that_takes_context_gets_the_whole_batch(
    make_worker: MakeWorker,
) -> None:
    registry = ReceiverRegistry()
    seen: list[tuple[int, int]] = []

    @receiver(WorkItemsDead, batch=True, takes_context=True, registry=registry)
    def batch(context: MessageContext, messages: list[Message]) -> None:
        assert context.messages == tuple(messages)
        seen.append((len(context.messages), len(messages)))
        with pytest.raises(ReceiverConfigurationError, match="batch"):
            context.message  # noqa: B018 (a batch has no single message)

    WorkItemsDead.send_many([{"id": str(i)} for i in range(3)])
    assert make_worker(WorkItemsDead, registry=registry, burst=True, batch_size=3).run().processed
    assert seen and all(a == b for a, b in seen)
    assert not WorkItemsDead.objects.exists()


def test_an_atomic_receivers_own_ack_is_recorded_in_its_context(
    make_worker: MakeWorker, events: WorkerEvents
) -> None:
    """An atomic receiver acks its message itself (``api.ack``: the lease held now, in its
    transaction); its context says so and the worker does not ack it again."""
    registry = ReceiverRegistry()

    @receiver(WorkItemsDead, takes_context=True, registry=registry)
    def acks_itself(context: MessageContext, message: Message) -> None:
        api.ack(message)
        assert context.acked(message)

    WorkItemsDead.send(id="s")
    stats = make_worker(WorkItemsDead, registry=registry, burst=True).run()
    assert (stats.processed, stats.failed) == (1, 0)
    assert events.counts["already_acked"] == 0
    assert not WorkItemsDead.objects.exists()


def test_a_context_that_outlives_its_run_sees_no_worker_state(make_worker: MakeWorker) -> None:
    """A context copied by the receiver's code (a thread or task it leaves behind) stays
    bound after the run: the verbs must then treat the message as anyone's, not as the
    finished run's (no worker lease, no "acked by the receiver")."""
    registry = ReceiverRegistry()
    kept: list[tuple[contextvars.Context, Message]] = []

    @receiver(WorkItemsDead, atomic=False, registry=registry)
    def leaves_a_context_behind(message: Message) -> None:
        assert handled_by_running_receiver(message)
        kept.append((contextvars.copy_context(), message))

    WorkItemsDead.send(id="k")
    assert make_worker(WorkItemsDead, registry=registry, burst=True).run().processed == 1
    [(copied, message)] = kept
    assert copied.run(handled_by_running_receiver, message) is False
    seen: list[bool] = []
    later = threading.Thread(target=lambda: seen.append(copied.run(_handled, message)))
    later.start()
    later.join()
    assert seen == [False]


def _handled(message: Message) -> bool:
    return handled_by_running_receiver(message)


def test_a_thread_the_receiver_starts_without_its_context_is_not_part_of_the_run(
    make_worker: MakeWorker,
) -> None:
    registry = ReceiverRegistry()
    seen: list[bool] = []

    @receiver(WorkItemsDead, atomic=False, registry=registry)
    def starts_a_thread(message: Message) -> None:
        thread = threading.Thread(target=lambda: seen.append(_handled(message)))
        thread.start()
        thread.join()

    WorkItemsDead.send(id="t")
    assert make_worker(WorkItemsDead, registry=registry, burst=True).run().processed == 1
    assert seen == [False]


def test_takes_context_must_be_a_bool() -> None:
    with pytest.raises(ReceiverConfigurationError, match="takes_context"):
        receiver(WorkItemsDead, takes_context="yes", registry=ReceiverRegistry())  # type: ignore[arg-type]


def test_a_receiver_that_takes_context_is_returned_unchanged() -> None:
    def plain(context: Any, message: Message) -> str:
        return "called"

    registry = ReceiverRegistry()
    assert receiver(WorkItemsDead, takes_context=True, registry=registry)(plain) is plain
    [spec] = registry.all()
    assert spec.takes_context


def test_the_lease_held_now_is_the_renewed_one(make_worker: MakeWorker) -> None:
    """``context.lease(message)`` gives the message with the lease the worker holds now: after a
    renewal (which rotates the token) it is no longer the token the receiver was handed."""
    if not engine_for(WorkItemsDead).features.rotates_lease_tokens:
        pytest.skip("engine keeps its lease tokens")
    registry = ReceiverRegistry()
    tokens: list[tuple[str | None, str | None]] = []
    renewed = threading.Event()

    @receiver(WorkItemsDead, atomic=False, takes_context=True, registry=registry)
    def long(context: MessageContext, message: Message) -> None:
        assert renewed.wait(60)
        tokens.append((message.lease_token, context.lease(message).lease_token))

    def listener(event: Any) -> None:
        if event.name == "renewed":
            renewed.set()

    WorkItemsDead.send(id="r")
    worker = make_worker(
        WorkItemsDead,
        registry=registry,
        burst=True,
        lease=timedelta(seconds=1),
        listeners=[listener],
    )
    assert worker.run().processed == 1
    [(handed, held)] = tokens
    assert handed != held


def test_the_receivers_page_context_snippet_runs_as_shown(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The block of "The run's context" in docs/howto/receivers.md, with ``myapp.models``'s
    ``UserTasks`` standing for a test queue: the receiver logs its context and is acked."""
    import logging
    import re
    import sys
    import types
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs/howto/receivers.md").read_text()
    section = page.split("## The run's context", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    myapp = types.ModuleType("myapp")
    models = types.ModuleType("myapp.models")
    models.UserTasks = WorkItemsDead  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "myapp", myapp)
    monkeypatch.setitem(sys.modules, "myapp.models", models)
    registry = ReceiverRegistry()
    monkeypatch.setattr(
        "spanner_queues.receiver",
        lambda *a, **kw: receiver(*a, registry=registry, **kw),
        raising=False,
    )
    namespace: dict[str, Any] = {"__name__": "docs_receivers"}
    exec(compile(code, "docs/howto/receivers.md", "exec"), namespace)
    [spec] = registry.all()
    assert spec.takes_context and spec.timeout == 60
    WorkItemsDead.send(id="doc")
    with caplog.at_level(logging.INFO, logger="docs_receivers"):
        stats = make_worker(WorkItemsDead, registry=registry, burst=True, worker_id="w-doc").run()
    assert (stats.processed, stats.failed) == (1, 0)
    assert any("attempt 1 on w-doc" in r.getMessage() for r in caplog.records)

"""``WorkerHealth`` on its own, with a moved monotonic clock: the loop-stall rule, the run
limit, and readiness before the worker started."""

from __future__ import annotations

import pytest

from spanner_queues.message import Message
from spanner_queues.worker import WorkerEvent
from spanner_queues.worker.health import WorkerHealth

pytestmark = pytest.mark.engine_independent  # events in, reasons out; no database


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def event(name: str, message: Message | None = None) -> WorkerEvent:
    return WorkerEvent(name=name, worker_id="w", message=message, receiver="app.work")


def message() -> Message:
    return Message(
        queue="app.Q", key=(1,), key_names=("id",), payload=b"", deliver_time=None, attempt=1
    )


def test_a_receive_loop_silent_past_the_stall_limit_is_not_live() -> None:
    clock = Clock()
    health = WorkerHealth(stall_seconds=60, monotonic=clock)
    health(event("worker_started"))
    clock.t += 59
    assert health.liveness() == []
    clock.t += 2
    [problem] = health.liveness()
    assert problem.startswith("the receive loop has not turned for 61.0 s")
    health(event("idle"))
    assert health.liveness() == []


def test_a_running_receiver_excuses_the_loop_until_it_passes_its_limit() -> None:
    clock = Clock()
    health = WorkerHealth(stall_seconds=60, max_run_seconds=300, monotonic=clock)
    health(event("worker_started"))
    health(event("started", message()))
    clock.t += 299
    assert health.liveness() == []  # all threads busy: the loop waits, legitimately
    clock.t += 2
    [problem] = health.liveness()
    assert "receiver app.work has run 301.0 s on app.Q(1,), past its limit of 300 s" == problem
    health(event("acked", message()))
    health(event("received"))
    assert health.liveness() == []


def test_no_limit_means_a_long_receiver_stays_live() -> None:
    clock = Clock()
    health = WorkerHealth(monotonic=clock)
    health(event("worker_started"))
    health(event("started", message()))
    clock.t += 86400
    assert health.liveness() == []


def test_not_ready_before_the_worker_started_nor_once_it_stops() -> None:
    health = WorkerHealth(monotonic=Clock())
    assert health.readiness() == ["starting: the worker is not receiving yet"]
    health(event("stopping"))
    [problem] = health.readiness()
    assert problem.startswith("stopping")


def test_a_lease_the_renewer_left_overdue_is_not_live() -> None:
    from datetime import timedelta
    from types import SimpleNamespace

    from spanner_queues import clock as sq_clock
    from spanner_queues.worker.slots import Delivery, Slots

    held = SimpleNamespace(plans=[], slots=Slots(1, None))
    health = WorkerHealth(stall_seconds=60, monotonic=Clock())
    health.attach(held)  # type: ignore[arg-type]
    now = sq_clock.now()
    late = Delivery(message(), plan=None, renew_at=now - timedelta(seconds=61))  # type: ignore[arg-type]
    held.slots.deliveries.add(late)
    [problem] = health.liveness()
    assert problem.startswith("the lease renewer is 61.") and "on 1 lease(s)" in problem
    late.acking = True  # an ack holds the token: the renewer leaves it alone, rightly
    assert health.liveness() == []
    late.acking, late.renew_at = False, now - timedelta(seconds=59)
    assert health.liveness() == []


def test_a_receiver_past_the_limit_its_timeout_of_gives_a_message_is_not_live() -> None:
    from types import SimpleNamespace

    from spanner_queues.worker.slots import Plan, Slots

    spec = SimpleNamespace(name="app.work", timeout=None, timeout_of=lambda m: 5.0)
    model = SimpleNamespace(_meta=SimpleNamespace(label="app.Q"))
    plan = Plan(model, (spec,), False, 1, "default", None, None, None)  # type: ignore[arg-type]
    clock = Clock()
    health = WorkerHealth(stall_seconds=60, monotonic=clock)
    health.attach(SimpleNamespace(plans=[plan], slots=Slots(1, None)))  # type: ignore[arg-type]
    health(event("worker_started"))
    health(event("started", message()))
    clock.t += 4
    assert health.liveness() == []
    clock.t += 2
    [problem] = health.liveness()
    assert problem.endswith("past its limit of 5 s")

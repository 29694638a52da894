"""The adaptive prefetch (``Worker(prefetch=None)``, the default): one message per free thread
until a unit was timed; a backlog of quick messages is then claimed in growing batches; slow
receivers take one message per free thread. Tests observe claims and events; no timing
assertions (the time budget is patched to make receivers "quick" or "slow" for sure)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import spanner_queues.worker.group as sq_group
import spanner_queues.worker.intake as sq_intake
from spanner_queues.worker import Worker, WorkerEvents
from tests.worker.conftest import require, running, watch_receives
from tests.workerapp.models import WorkItems, WorkLog

pytestmark = pytest.mark.django_db(transaction=True)
MakeWorker = Callable[..., Worker]


def _count_receives(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int | None, int]]:
    """Sizes the worker asked for and got back: (max_messages, got)."""
    sizes: list[tuple[int | None, int]] = []
    watch_receives(
        monkeypatch,
        lambda kwargs, got: sizes.append((kwargs.get("max_messages"), len(got))),
        WorkItems,
    )
    return sizes


def test_adaptive_is_the_default() -> None:
    worker = Worker(["workerapp.WorkItems"], install_signal_handlers=False)
    assert worker.prefetch is None and worker.intake.depth == 1


def test_a_backlog_of_quick_messages_is_claimed_in_batches(
    make_worker: MakeWorker, events: WorkerEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sq_intake, "AHEAD_SECONDS", 1e6)  # every receiver is quick: half the lease
    sizes = _count_receives(monkeypatch)
    sent = WorkItems.send_many([{"payload": {}} for _ in range(120)])
    stats = make_worker(WorkItems, burst=True, concurrency=1).run()
    assert stats.processed == 120 and stats.received == 120 and stats.failed == 0
    logged = list(WorkLog.objects.values_list("key", flat=True))
    assert sorted(logged) == sorted(m.key[0] for m in sent)  # each once, in its own txn
    assert events.counts["acked"] == 120 and events.counts["returned"] == 0
    got = [n for _, n in sizes if n]
    assert got[0] == 1  # nothing timed yet: one for the free thread
    assert max(got) > 2  # then the claims grew
    # (SQLite: two groups' worth)
    most = max(2 * sq_group.DEFAULT_GROUP_SIZE_SINGLE_WRITER, sq_intake.AUTO_PREFETCH_MAX)
    assert all(asked is None or asked <= most for asked, _ in sizes)


def test_slow_receivers_take_one_message_per_free_thread(
    make_worker: MakeWorker, events: WorkerEvents, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sq_intake, "AHEAD_SECONDS", 0.0)  # every receiver is slow
    sizes = _count_receives(monkeypatch)
    WorkItems.send_many([{"payload": {}} for _ in range(30)])
    stats = make_worker(WorkItems, burst=True, concurrency=2).run()
    assert stats.processed == 30
    assert all(asked is not None and asked <= 2 for asked, _ in sizes)  # the free threads


def test_a_slow_receiver_holds_nothing_waiting(
    make_worker: MakeWorker, events: WorkerEvents, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sq_intake, "AHEAD_SECONDS", 0.0)  # every receiver is slow
    go = tmp_path / "go"
    WorkItems.send_many([{"payload": {}} for _ in range(5)])
    with running(make_worker(WorkItems, concurrency=1)) as worker:
        assert events.wait_for("acked", 5)  # timed: the receiver is slow
        WorkItems.send_many([{"payload": {"block": str(go), "mode": "external"}} for _ in range(6)])
        assert events.wait_for("started", 6)
        assert events.counts["received"] == 6  # one running, none claimed ahead
        assert len(worker.slots.deliveries) == 1
        go.touch()
        assert events.wait_for("acked", 11)
    assert not WorkItems.objects.exists()


def test_depth_grows_on_full_receives_within_the_lease_and_shrinks_on_slow_units() -> None:
    worker = Worker(["workerapp.WorkItems"], install_signal_handlers=False, group_size=1)
    take = worker.intake
    take.lease_seconds = 10.0
    take.adapt(full=True)
    assert take.depth == 1  # nothing timed yet
    worker.slots.unit_seconds = 0.001  # quick: 0.25 s holds 250, capped
    depths = []
    for _ in range(9):
        take.adapt(full=True)
        depths.append(take.depth)
    assert depths[:4] == [2, 4, 8, 16] and depths[-1] == sq_intake.AUTO_PREFETCH_MAX
    take.adapt(full=False)  # a short backlog keeps it
    assert take.depth == sq_intake.AUTO_PREFETCH_MAX
    take.lease_seconds = 0.02  # a short lease: what is held must start within half of it
    take.adapt(full=True)
    assert take.depth == 10
    worker.slots.unit_seconds = 0.2  # slow receivers: one each
    take.adapt(full=True)
    assert take.depth == 1


def test_messages_claimed_ahead_are_given_back_unstarted_at_stop(
    make_worker: MakeWorker, events: WorkerEvents, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require("supports_release")  # as with a fixed prefetch (native: left to their lease)
    monkeypatch.setattr(sq_intake, "AHEAD_SECONDS", 1e6)  # every receiver is quick
    go = tmp_path / "go"
    WorkItems.send_many([{"payload": {}} for _ in range(5)])
    worker = make_worker(WorkItems, concurrency=1)
    with running(worker):
        assert events.wait_for("acked", 5)  # timed and grown: the next claim takes several
        assert worker.intake.depth > 1
        WorkItems.send_many([{"payload": {"block": str(go), "mode": "external"}} for _ in range(8)])
        assert events.wait_for("started", 6)
        ahead = events.counts["received"] - 6
        assert ahead >= 1  # claimed ahead of the one running
        worker.stop()
        go.touch()
    assert events.counts["acked"] == 6
    assert events.counts["returned"] == ahead and worker.stats.returned == ahead
    left = list(WorkItems.objects.all())
    assert len(left) == 7 and all(row.attempts == 0 for row in left)  # no attempt spent


@pytest.mark.parametrize("group_size", [1, 20, 100, 300])
def test_a_thread_that_groups_may_hold_two_of_its_largest_groups(group_size: int) -> None:
    """So that one group fills while the next is claimed: a group closes full, not at the end
    of what one claim brought."""
    worker = Worker(["workerapp.WorkItems"], install_signal_handlers=False, group_size=group_size)
    take = worker.intake
    take.lease_seconds = 1e6
    worker.slots.unit_seconds = 1e-6  # quick: only the cap binds
    for _ in range(12):
        take.adapt(full=True)
    assert take.depth == max(sq_intake.AUTO_PREFETCH_MAX, 2 * group_size)


def test_a_batch_receivers_queue_holds_no_more_for_groups_it_never_forms() -> None:
    worker = Worker(["workerapp.Dirty"], install_signal_handlers=False, group_size=300)
    assert worker.intake.most_ahead() == sq_intake.AUTO_PREFETCH_MAX


def test_a_batch_receiver_has_its_next_batch_claimed_while_its_first_runs(
    events: WorkerEvents,
) -> None:
    """A batch's claim may take as long as a batch's run (on SQLite it waits for the write lock
    behind an ack): serving batch receivers, the adaptive prefetch claims one batch a thread
    ahead from the first claim on (before any unit was timed), and no more then."""
    import threading

    from spanner_queues.receivers import ReceiverRegistry, receiver

    registry = ReceiverRegistry()
    first_runs, go = threading.Event(), threading.Event()
    ran: list[int] = []

    @receiver(WorkItems, batch=True, max_batch_size=3, registry=registry)
    def batches(messages: list[object]) -> None:
        first_runs.set()
        assert go.wait(30)
        ran.append(len(messages))

    WorkItems.send_many([{"payload": {}} for _ in range(15)])
    worker = Worker(
        [WorkItems],
        registry=registry,
        concurrency=1,
        install_signal_handlers=False,
        listeners=[events],
        poll_interval=0.05,
    )
    with running(worker):
        assert first_runs.wait(10)
        with worker.slots.cond:  # (the intake claims while the first batch runs)
            assert worker.slots.cond.wait_for(lambda: worker.slots.waiting == 1, timeout=10)
            assert worker.slots.in_flight == 2  # the running batch and one ahead, no more
        go.set()
        assert events.wait_for("acked", 15)
    assert sum(ran) == 15
    assert events.counts["received"] == 15

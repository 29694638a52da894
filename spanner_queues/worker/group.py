"""Group commit: several deliveries' receivers run in one transaction, which commits once; their
writes and acks commit together or not at all.

An executor that takes a single-message unit whose receiver may run in a group (``wants``)
runs it, then takes more units of the same queue waiting in the worker's queue (never waits
for one), until the group holds ``group_size`` messages or its receivers ran ``group_ms``
milliseconds, whichever comes first (``GroupLimits``; ``QueueMeta.group_size`` /
``group_ms`` over the worker's ``group_size`` / ``group_ms``). Then it commits and the
outcomes go to ``Outcomes.settle``, as a single run's do.

- The acks of the group ride its commit in one ``ack_many`` (one statement or call for the
  whole group, not one per message); if that ack is refused (a message acked by someone else,
  a stale lease) the group runs again with each receiver's ack made after it, which finds
  which one. A lease lost while the group ran drops its delivery: the group runs again
  without it.
- Where the database has savepoints (``transactions.has_savepoints``: SQLite, PostgreSQL) each
  receiver runs in its own: one that raises rolls back alone and is settled like any failure.
- Rows a run hands to the group (``MessageContext.write_with_group``: the Tasks runner's result
  rows) are written after the group's last receiver and before its ack, one call a kind of row
  for the whole group (one INSERT, not one a task); a run that fails has its rows dropped.
- Where there are none (Spanner: the table engine on Spanner and native queues) a receiver
  that raises rolls the whole transaction back and the group runs again without it.
- A receiver whose failure may leave the connection in doubt (a time limit's interrupt), a
  non-atomic receiver that raises, or one that leaves the transaction marked for rollback:
  the whole group rolls back and runs again without it.
- A transaction that loses a race (Spanner ABORTED, SQLite locked) runs every receiver of the
  group again (``run_in_transaction``): at least once, as always. One that fails otherwise
  (its commit refused: a deferred constraint, the database gone past the retries) runs each
  of its messages again alone, so that a message whose writes cannot commit fails alone. No
  write of a failed receiver commits, and no write commits twice (each run of the group is one
  transaction).
- Not grouped: batch receivers, ``@receiver(group=False)``, non-atomic receivers (unless they
  declare ``group=True``: their own transactions then nest in the group's as savepoints, where
  the database has them; the Tasks runner does), and queues whose ``group_size`` is 1.

Time limits stay per receiver; leases stay renewed while a delivery waits in the group, and the
lease an ack reads is no longer renewed (``Leases.freeze``), as in a single run. A group that
commits counts one ``commits`` and its size in ``grouped`` / ``groups`` (``WorkerStats``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db import connections, transaction

from spanner_queues.exceptions import (
    AckedFailure,
    InvalidArgument,
    LeaseLost,
    MessageAlreadyAcked,
    QueueConfigurationError,
    StaleAck,
    TimeLimitExceeded,
)
from spanner_queues.receivers import GroupRows, NoReceiver, ReceiverSpec, running
from spanner_queues.transactions import (
    has_savepoints,
    lost_race,
    run_in_transaction,
    savepoint,
    single_writer,
)
from spanner_queues.worker.outcomes import Kind, Outcome, outcomes_of
from spanner_queues.worker.run import Runner
from spanner_queues.worker.slots import Delivery, Plan, Unit

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("spanner_queues.worker")

#: messages a group holds at most, by default (``--group-size``; 1: no groups), on a
#: database whose one write lock serves every writer (SQLite): there a commit is an fsync
#: that every writer waits for, and the group's time (``DEFAULT_GROUP_MS``) bounds how long
#: it holds the lock (groups of 100 drained 1.4-2x groups of 20, docs/benchmarks.md)
DEFAULT_GROUP_SIZE_SINGLE_WRITER = 100
#: ... and elsewhere (PostgreSQL, Spanner: a larger transaction holds more row locks, and on
#: Spanner is likelier to abort and run all its receivers again)
DEFAULT_GROUP_SIZE = 20
#: milliseconds of receiver time after which a group commits, by default (``--group-ms``),
#: on a database whose one write lock serves every writer (``Driver.single_writer``: SQLite),
#: where a group holds it from its first write to its commit
DEFAULT_GROUP_MS = 50.0
#: ... and elsewhere (PostgreSQL, Spanner: a group holds only the rows it wrote; a Spanner
#: call takes milliseconds, and 50 ms closed groups of four)
DEFAULT_GROUP_MS_MANY_WRITERS = 250.0
#: the most a group may hold: Spanner takes at most 80,000 mutations per commit, and a group's
#: acks and writes all go into one
MAX_GROUP_SIZE = 500


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """When a group commits: at ``size`` messages or after ``seconds`` of receiver time."""

    size: int
    seconds: float


def check_limits(size: object, ms: object, where: str) -> None:
    """``InvalidArgument`` for a group size or time out of range."""
    if size is not None and (
        not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_GROUP_SIZE
    ):
        raise InvalidArgument(f"{where}group_size must be an int from 1 to {MAX_GROUP_SIZE}.")
    if ms is not None and (
        isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 < ms < float("inf")
    ):
        raise InvalidArgument(f"{where}group_ms must be a positive number of milliseconds.")


def limits_of(plan: Plan, size: int | None, ms: float | None) -> GroupLimits:
    """The plan's queue's ``QueueMeta.group_size`` / ``group_ms``, else the worker's, else the
    defaults."""
    options = plan.options
    try:
        check_limits(options.group_size, options.group_ms, f"{plan.label}: QueueMeta.")
    except InvalidArgument as exc:
        raise QueueConfigurationError(str(exc)) from None
    one_lock = single_writer(plan.db)
    n = (
        options.group_size
        or size
        or (DEFAULT_GROUP_SIZE_SINGLE_WRITER if one_lock else DEFAULT_GROUP_SIZE)
    )
    t = options.group_ms or ms or (DEFAULT_GROUP_MS if one_lock else DEFAULT_GROUP_MS_MANY_WRITERS)
    return GroupLimits(n, t / 1000)


def groupable(spec: ReceiverSpec, savepoints: bool) -> bool:
    """Whether ``spec``'s runs may share a transaction with others'."""
    if spec.batch or spec.group is False:
        return False
    return spec.atomic or (spec.group is True and savepoints)


class _Drop(Exception):
    """A receiver's failure that rolls the whole group back: it runs again without it."""

    def __init__(self, outcome: Outcome, *, doubtful: bool = False) -> None:
        super().__init__("a receiver of the group failed")  # (no driver error text: no retry)
        self.outcome = outcome
        #: the connection may be anywhere (a time limit's interrupt): reconnect
        self.doubtful = doubtful


class _AckRefused(Exception):
    """The group's one ack was refused: run again, each receiver acking its own."""

    def __init__(self) -> None:
        super().__init__("the group's ack was refused")


class Groups:
    """Runs groups of deliveries (see the module docstring) through a ``Runner``."""

    def __init__(self, runner: Runner, *, size: int | None, ms: float | None) -> None:
        check_limits(size, ms, "")
        self.runner = runner
        self.size = size
        self.ms = ms
        self._limits: dict[str, GroupLimits] = {}
        #: per database alias: whether it has savepoints (the vendor's, for the worker's life)
        self._savepoints: dict[str, bool] = {}

    def limits(self, plan: Plan) -> GroupLimits:
        found = self._limits.get(plan.label)
        if found is None:
            found = self._limits[plan.label] = limits_of(plan, self.size, self.ms)
        return found

    def savepoints(self, using: str) -> bool:
        found = self._savepoints.get(using)
        if found is None:
            found = self._savepoints[using] = has_savepoints(using)
        return found

    def longest(self, plans: list[Plan]) -> float:
        """The longest receiver time of a group of ``plans`` (0: none groups)."""
        return max((self.limits(p).seconds for p in plans if self.limits(p).size > 1), default=0)

    def largest(self, plans: list[Plan]) -> int:
        """The most messages a group of ``plans`` holds (1: none groups; a batch receiver's
        queue never does)."""
        return max((self.limits(p).size for p in plans if not p.batch), default=1)

    def wants(self, unit: Unit) -> bool:
        """Whether ``unit`` runs in a group: one message of a queue whose groups hold more
        than one, routed to a receiver that may be grouped."""
        plan = unit[0].plan
        if plan.batch or len(unit) != 1 or self.limits(plan).size <= 1:
            return False
        try:
            spec = self.runner.registry.route(plan.specs, unit[0].message)
        except NoReceiver:
            return False
        return groupable(spec, self.savepoints(plan.db))

    def run(self, first: Unit, pull: Callable[[], Unit | None], ran: list[Unit]) -> None:
        """Run ``first`` and the units ``pull()`` gives (None: no more) in one transaction
        and settle their outcomes after it. Each unit taken is appended to ``ran``."""
        plan = first[0].plan
        runner = self.runner
        limits = self.limits(plan)
        savepoints = self.savepoints(plan.db)
        before: list[Outcome] = []
        todo: list[tuple[ReceiverSpec, Delivery]] = []
        dropped: list[Outcome] = []
        #: deliveries acked by their receiver's own code (not in the group's ack)
        own: set[int] = set()
        # every receiver's ack rides one ``ack_many`` at the end of the group until one is
        # refused; then each receiver acks its own (in its savepoint, where there are some)
        state = {"pulling": True, "deferred": True}
        t0 = time.monotonic()

        def add(unit: Unit) -> None:
            not_run, routes = runner._route(plan, unit)
            before.extend(not_run)
            for spec, ds in routes:
                for d in ds:
                    runner.reporter.emit("started", message=d.message, receiver=spec.name)
                    todo.append((spec, d))

        def more() -> bool:
            """Take one more unit, while the group is open."""
            if not state["pulling"] or runner.slots.stopping:
                return False
            if len(ran) >= limits.size or time.monotonic() - t0 >= limits.seconds:
                return False
            unit = pull()
            if unit is None:
                state["pulling"] = False
                return False
            ran.append(unit)
            add(unit)
            return True

        def attempt() -> list[Outcome]:
            outcomes: list[Outcome] = []
            rows = GroupRows()
            i = 0
            while i < len(todo) or more():
                if i >= len(todo):
                    continue
                spec, d = todo[i]
                i += 1
                outcomes.append(
                    self._one(plan, spec, d, savepoints, state["deferred"], own, connection, rows)
                )
            rows.write()
            if state["deferred"]:
                acked = [o.delivery for o in outcomes if o.kind is Kind.ACKED]
                self._ack_all(plan, [d for d in acked if id(d) not in own])
            return outcomes

        add(first)
        outcomes: list[Outcome] = []
        while todo or state["pulling"]:
            own.clear()
            connection = connections[plan.db]  # this thread's (the same after a close_all)
            try:
                outcomes = run_in_transaction(attempt, using=plan.db, retries=plan.retries)
                break
            except _Drop as drop:
                state["pulling"] = False
                if drop.doubtful:  # start again on fresh connections
                    connections.close_all()
                dropped.append(drop.outcome)
                todo = [(s, d) for s, d in todo if d is not drop.outcome.delivery]
            except _AckRefused:
                state["pulling"] = False
                state["deferred"] = False
            except Exception:  # the commit (or the database) failed otherwise: each alone
                logger.warning(
                    "a group of %d message(s) of %s failed to commit; running each alone",
                    len(todo),
                    plan.label,
                    exc_info=True,
                    extra={"action": "group_failed", "queue": plan.label},
                )
                alone = [o for spec, d in todo for o in runner._run(plan, spec, [d])]
                runner.outcomes.settle(before + dropped + alone)
                return
        if todo:
            runner.reporter.count("commits")
            runner.reporter.count("groups")
            runner.reporter.count("grouped", len(todo))
            acked = sum(1 for o in outcomes if o.kind is Kind.ACKED)
            runner.reporter.emit("committed", queue=plan.label, size=acked)
        runner.outcomes.settle(before + dropped + outcomes)

    def _one(
        self,
        plan: Plan,
        spec: ReceiverSpec,
        d: Delivery,
        savepoints: bool,
        deferred: bool,
        own: set[int],
        connection: BaseDatabaseWrapper,
        rows: GroupRows,
    ) -> Outcome:
        """Run one receiver of the group (in its savepoint where there are savepoints); its
        outcome, or ``_Drop`` when the group must run again without it."""
        runner = self.runner
        limit = plan.time_limit(spec, [d.message])
        started = time.monotonic()
        context = runner._context(spec, [d], started, limit, grouped=True)
        context._rides = rows
        try:
            with running(context):
                if savepoints and spec.atomic:
                    with savepoint(plan.db, connection=connection):
                        runner._call(plan, spec, [d], context, limit, ack=not deferred)
                elif savepoints:  # non-atomic, group=True: its own transactions nest
                    runner._call(plan, spec, [d], context, limit)
                    if not deferred:
                        with transaction.atomic(using=plan.db):
                            runner._ack(plan, [d], context)
                else:
                    runner._call(plan, spec, [d], context, limit, ack=not deferred)
                if context.acked(d.message):
                    own.add(id(d))
        except Exception as exc:
            if lost_race(exc, plan.db):
                raise  # the group lost a race (or its connection): it runs again
            rows.drop(context)
            took = time.monotonic() - started
            [outcome] = outcomes_of(exc, [d], spec.name, took, atomic=spec.atomic)
            doubtful = isinstance(exc, TimeLimitExceeded)
            poisoned = connection.needs_rollback
            if not savepoints or doubtful or poisoned:
                raise _Drop(outcome, doubtful=doubtful) from exc
            if not spec.atomic and not isinstance(exc, AckedFailure):
                raise _Drop(outcome) from exc  # (its own acks roll back with the group)
            return outcome
        if connection.needs_rollback:  # it swallowed an error of the transaction
            error = RuntimeError(f"{spec.name} left the transaction marked for rollback")
            [outcome] = outcomes_of(error, [d], spec.name, 0.0, atomic=spec.atomic)
            raise _Drop(outcome)
        return Outcome(Kind.ACKED, d, spec.name, time.monotonic() - started)

    def _ack_all(self, plan: Plan, deliveries: list[Delivery]) -> None:
        """The group's acks in one ``ack_many`` riding its commit. A lease lost meanwhile
        drops its delivery (the group runs again without it); a refused ack runs the group
        again with each receiver acking its own."""
        for d in deliveries:
            if d.lease_lost:
                error = LeaseLost(f"{d.message}: lease lost while the group ran; not acked.")
                raise _Drop(Outcome(Kind.LEASE_LOST, d, error=error))
        messages = self.runner.leases.freeze(deliveries)
        try:
            plan.policy.ack(plan.model, messages, using=plan.db)
        except (MessageAlreadyAcked, StaleAck):
            transaction.set_rollback(True, using=plan.db)
            raise _AckRefused() from None

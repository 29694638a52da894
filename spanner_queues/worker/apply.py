"""*apply*: write what *decide* settled, and report it (the pipeline's third station).

``Outcomes.settle(outcomes)`` takes the outcomes of one run (or of several: a list of any
deliveries) and, for each, asks ``decide`` for its ``Settlement``, writes it along one route
(``DeliveryPolicy``, on the plan's engine: ``requeue`` to this queue or its dead-letter queue,
``release``, ``ack_many``, ``record_failure``) and reports it through one table
(``events.REPORTS``: log level and text, counter, event). It holds no ``Worker``: a
``Reporter``, the ``Leases`` it writes through, and what it remembers of unmatched messages.
The worker and ``testing.drain()`` both settle through it.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from spanner_queues import causes, clock
from spanner_queues.exceptions import (
    InvalidMessage,
    LeaseLost,
    MessageAlreadyAcked,
    MessageAlreadyExists,
    Retry,
)
from spanner_queues.message import LATEST_DELIVER_TIME, Message, OutgoingMessage, may_have_failed
from spanner_queues.options import queue_options
from spanner_queues.queues import get_queue
from spanner_queues.receivers import ReceiverSpec
from spanner_queues.signals import messages_acked, requeued, send_on_commit
from spanner_queues.transactions import run_in_transaction
from spanner_queues.worker.decide import (
    PARKED_UNTIL,
    Action,
    Settlement,
    decide,
    exhausted,
    over_limit,
    park,
)
from spanner_queues.worker.events import REPORTS
from spanner_queues.worker.outcomes import FAILURES, Kind, Outcome

if TYPE_CHECKING:
    from spanner_queues.engines.base import BaseQueueEngine
    from spanner_queues.models import Queue
    from spanner_queues.worker.events import Reporter
    from spanner_queues.worker.leases import Leases
    from spanner_queues.worker.slots import Delivery, Plan

logger = logging.getLogger("spanner_queues.worker")

#: what *decide* is given where no settlement of the kind reads the time (acked, lost)
NO_TIME, NO_WAIT = datetime.min, timedelta(0)

#: at most this many (queue, kind of miss) pairs are remembered for the once-only warning
MISMATCHES_REMEMBERED = 1000
#: at most this many unmatched messages' miss counts are remembered (their back-off grows)
MISSES_REMEMBERED = 10_000


@dataclass(frozen=True, slots=True)
class Failure:
    """What ``DeliveryPolicy.fail`` decided about a failed run: the number of the attempt that
    failed, and whether it was the last one allowed (``QueueMeta.max_attempts``): then the
    message is dead-lettered or discarded, else given back due after the back-off."""

    attempt: int | None
    exhausted: bool


class Unstarted(enum.Enum):
    """What ``DeliveryPolicy.return_unstarted`` did with a message that was never run."""

    #: given back, due now
    RETURNED = "returned"
    #: to be run now (giving it back would spend an attempt that never ran)
    RUN = "run"
    #: kept: left to its lease expiry (the engine cannot give back)
    KEPT = "kept"


class DeliveryPolicy:
    """Back-off, attempts, giving back, retry and discard for the queues of one engine, on the
    engine's storage verbs (``ack_many``, ``requeue``, ``release``, ``record_failure``).
    Cheap to make: it holds the engine and nothing else. Its acks and re-sends send the verbs'
    signals on commit (``messages_acked``, ``messages_sent``), as the verbs' do: an ack is
    counted on that one channel, whoever made it."""

    __slots__ = ("engine",)

    def __init__(self, engine: BaseQueueEngine) -> None:
        self.engine = engine

    def backoff(self, message: Message) -> timedelta:
        """How long a message waits before its next delivery after ``message.attempt`` failed
        (``SPANNER_QUEUES[alias]["OPTIONS"]["BACKOFF"]``; hourly once it is old)."""
        age = clock.now() - (message.send_time or clock.now())
        return self.engine.params.backoff.delay(max(message.attempt or 1, 1), age)

    @staticmethod
    def exhausted(model: type[Queue], message: Message) -> bool:
        """Whether ``message`` was delivered more often than ``QueueMeta.max_attempts`` allows
        (runs lost to lease expiry count): it must not run again."""
        return over_limit(queue_options(model), message.attempt)

    def ack(self, model: type[Queue], messages: Sequence[Message], *, using: str) -> None:
        """Ack received messages in the caller's transaction with the leases they carry
        (``ack_many``: ``StaleAck`` where the engine checks leases and a row no longer holds
        its token; a message without a token is acked by key; the failures recorded of them go
        with them). All or nothing; on failure the caller's transaction is marked for
        rollback."""
        if not messages:
            return
        self.engine.ack_many(
            model, [m.key for m in messages], using=using, lease_tokens=_tokens(messages)
        )
        send_on_commit(messages_acked, model, messages, using)

    def fail(
        self, model: type[Queue], message: Message, error: BaseException | None, *, using: str
    ) -> Failure:
        """Count a failed run of ``message`` (``record_failure``, in a transaction of its own;
        if that fails, it is logged and the delivery's attempt number stands) and say whether
        it was the last attempt allowed."""
        engine = self.engine
        attempt: int | None
        try:
            attempt = run_in_transaction(
                lambda: engine.record_failure(model, message, error, using=using),
                using=using,
                retries=engine.params.transaction_retries,
            )
        except Exception:
            logger.exception("%s: recording the failure failed", message)
            attempt = message.attempt
        causes.note(model._meta.label, error, using=using)  # (best effort, its own transaction)
        return Failure(attempt=attempt, exhausted=exhausted(queue_options(model), attempt))

    def give_back(
        self, model: type[Queue], message: Message, *, deliver_time: datetime | None = None
    ) -> bool:
        """Give a held message back before its lease ends, due at ``deliver_time`` (default:
        after the back-off for its attempt). False where the engine cannot release
        (``supports_release``): the message then comes back after its lease. ``LeaseLost`` if
        the lease is no longer held."""
        if not self.engine.features.supports_release:
            return False
        due = deliver_time or clock.now() + self.backoff(message)
        self.engine.release(model, message, deliver_time=due)
        return True

    def return_unstarted(self, model: type[Queue], message: Message, *, using: str) -> Unstarted:
        """Give back a received message that was never run, due now, without spending one of
        its attempts (the delivery counted one; enough graceful stops would otherwise
        dead-letter a message that never ran):

        - engines that count deliveries: a first delivery is acked and sent again under its
          key in one transaction (``requeue``: attempts back to 0); a later one (it failed
          before) is to be run now (``RUN``), so that its attempt is one that ran;
        - the others (attempts are failed runs, not deliveries): released due now, or
          ``KEPT`` (left to its lease expiry) where the engine cannot release.
        """
        engine = self.engine
        if not engine.features.supports_attempt_count:
            given = self.give_back(model, message, deliver_time=clock.now())
            return Unstarted.RETURNED if given else Unstarted.KEPT
        if may_have_failed(message):
            return Unstarted.RUN
        run_in_transaction(
            lambda: self.resend(model, [message], [None], using=using),
            using=using,
            retries=engine.params.transaction_retries,
        )
        return Unstarted.RETURNED

    def resend(
        self,
        model: type[Queue],
        messages: Sequence[Message],
        dues: Sequence[datetime | None],
        *,
        to: type[Queue] | None = None,
        using: str,
    ) -> list[Message]:
        """Ack ``messages`` and send each again under its key with its payload, due at its
        ``dues`` (None: now), to ``to`` (default: the same queue; its dead-letter queue), in
        the caller's transaction (``signals.requeued``: the verbs' one way, with their
        signals). A retry, an unmatched message given back, a dead letter."""
        again = []
        for m, due in zip(messages, dues, strict=True):
            if due is not None and due > LATEST_DELIVER_TIME:
                raise InvalidMessage(
                    f"{m}: due {due}, after {LATEST_DELIVER_TIME:%Y-%m-%d}, the latest a "
                    "queue accepts."
                )
            again.append(
                OutgoingMessage(key=m.key_dict, payload=m.stored_payload, deliver_time=due)
            )
        return requeued(self.engine, model, messages, again, using=using, to=to)

    def discard(self, model: type[Queue], messages: Sequence[Message], *, using: str) -> None:
        """Drop messages whose attempts are exhausted (``discard_after_max_attempts``) in the
        caller's transaction: ack them as ``ack`` does (their recorded failures go with
        them, the failed run just recorded included)."""
        self.ack(model, messages, using=using)


def _tokens(messages: Sequence[Message]) -> list[str | None]:
    return [m.lease_token for m in messages]


class Outcomes:
    """Settles outcomes (``settle``), reporting through a ``Reporter`` and writing leases
    through ``Leases``; also gives back at stop what was never started
    (``return_unstarted``). ``gone`` is called when a message left its queue for good
    (dead-lettered, discarded: a periodic schedule may need its seed again)."""

    def __init__(
        self, reporter: Reporter, leases: Leases, *, gone: Callable[[], None] | None = None
    ) -> None:
        self.reporter = reporter
        self.leases = leases
        self._gone = gone or (lambda: None)
        #: (queue, kind of miss) pairs already warned of (``unmatched``)
        self.mismatches: set[tuple[str, str]] = set()
        #: (queue, key) -> times no receiver of this worker matched it, least recent first
        self.misses: OrderedDict[tuple[str, tuple[Any, ...]], int] = OrderedDict()
        self._mismatch_lock = threading.Lock()

    # --- the one entry ---------------------------------------------------------------------
    def settle(self, outcomes: Sequence[Outcome]) -> list[Settlement]:
        """Decide, write and report each of ``outcomes`` (of any deliveries); returns their
        settlements, in order. A retried or unmatched delivery is requeued with the others of
        its queue in one transaction; a failure is counted (the failure ledger) before it is
        decided. A stuck run was settled when the worker gave up on it (``STUCK``): the run's
        own failure is then nothing more."""
        settled: dict[int, Settlement] = {}
        moves: dict[str, list[tuple[Outcome, Settlement]]] = {}
        for o in outcomes:
            d = o.delivery
            if o.kind in FAILURES and o.kind is not Kind.STUCK and d.stuck:
                settled[id(o)] = Settlement(Action.NOTHING, "stuck")
                continue
            if o.kind in FAILURES:
                self.report("failed", o)
            s = self.decide(o)
            settled[id(o)] = s
            if s.action is Action.REQUEUE:
                moves.setdefault(d.plan.label, []).append((o, s))
            else:
                self._write(o, s)
        for group in moves.values():
            self._requeue(group)
        return [settled[id(o)] for o in outcomes]

    def decide(self, o: Outcome) -> Settlement:
        """*decide* with what it needs: the back-off (for an unmatched message, after its
        misses), the attempt a failure was counted as (``DeliveryPolicy.fail``), the lease."""
        d = o.delivery
        plan, m = d.plan, d.message
        attempt = m.attempt
        if o.kind is Kind.UNMATCHED:
            m = dataclass_replace(m, attempt=self.missed(m))
        elif o.kind in FAILURES and not (d.lease_lost or o.acked):
            attempt = plan.policy.fail(plan.model, m, o.error, using=plan.db).attempt
            m = dataclass_replace(m, attempt=attempt)
        if o.kind in (Kind.ACKED, Kind.LEASE_LOST, Kind.ALREADY_ACKED):
            return decide(o, plan.options, now=NO_TIME, backoff=NO_WAIT)  # (no time read)
        return decide(
            o,
            plan.options,
            now=clock.now(),
            backoff=plan.policy.backoff(m),
            attempt=attempt,
            lease_held=not d.lease_lost,
        )

    # --- the one write route -----------------------------------------------------------------
    def _write(self, o: Outcome, s: Settlement) -> None:
        d = o.delivery
        action = s.action
        if action is Action.ACKED or action is Action.NOTHING:
            if s.report in ("acked", "lease_lost", "already_acked", "cancelled"):
                self.report(s.report, o)
            return
        if action is Action.RELEASE or action is Action.PARK:
            self.release(d, deliver_time=s.due)
            return
        m = self.leases.freeze([d])[0]
        plan = d.plan
        try:
            if action is Action.DEAD_LETTER:
                target = get_queue(plan.options.dead_letter_queue or "")
                run_in_transaction(
                    lambda: plan.policy.resend(plan.model, [m], [None], to=target, using=plan.db),
                    using=plan.db,
                    retries=plan.retries,
                )
            else:  # DISCARD
                run_in_transaction(
                    lambda: plan.policy.discard(plan.model, [m], using=plan.db),
                    using=plan.db,
                    retries=plan.retries,
                )
        except MessageAlreadyAcked:
            if s.report == "cancelled":  # deleted by the cancel itself (native queues)
                self.report(s.report, o, message=m)
                return
            self.log("already_acked", m, o.duration, "%s: already acked; nothing to dead-letter")
            return
        except LeaseLost:  # StaleAck: delivered again or replaced meanwhile
            self.log("lease_lost", m, o.duration, "%s: lease lost; not dead-lettered")
            return
        except MessageAlreadyExists:
            # The dead-letter queue already holds this key (an earlier dead letter, a periodic
            # or heartbeat key). Neither lose nor overwrite it, and do not deliver it again and
            # again: park it in its queue, logged once; an operator resolves the clash.
            parked = park()
            self.report(parked.report, o, message=m)
            self.release(d, deliver_time=parked.due)
            return
        self.report(s.report, o, message=m)
        causes.note(plan.label, o.error, using=plan.db, failed=0, given_up=1)
        self._gone()  # a periodic message may have gone: re-seed

    def _requeue(self, group: list[tuple[Outcome, Settlement]]) -> None:
        """Ack and send again under their keys, due as settled, in one transaction, the
        deliveries whose lease is still held (``DeliveryPolicy.resend``); lost leases and
        messages acked meanwhile are reported."""
        deliveries = [o.delivery for o, _ in group]
        self.leases.freeze(deliveries)
        mine = [(o, s) for o, s in group if not o.delivery.lease_lost]
        for o, _ in group:
            if o.delivery.lease_lost:
                self.report("lease_lost", o, error=o.error or LeaseLost())
        if not mine:
            return
        plan = mine[0][0].delivery.plan

        def move() -> None:
            plan.policy.resend(
                plan.model,
                [o.delivery.message for o, _ in mine],
                [s.due for _, s in mine],
                using=plan.db,
            )

        try:
            run_in_transaction(move, using=plan.db, retries=plan.retries)
        except MessageAlreadyAcked as err:
            for o, s in mine:
                m = o.delivery.message
                self.log("already_acked", m, o.duration, f"%s: already acked; not {s.report}")
                self.reporter.emit("already_acked", message=m, error=err)
            return
        except LeaseLost as err:  # StaleAck: delivered again or replaced meanwhile
            for o, _ in mine:
                self.report("lease_lost", o, error=err)
            return
        for o, s in mine:
            self.report(s.report, o)

    def release(self, d: Delivery, *, deliver_time: datetime | None = None) -> None:
        """Give ``d`` back due at ``deliver_time`` (default: after its back-off), where the
        engine can; else it comes back after its lease."""
        plan = d.plan

        def give_back() -> bool:
            if d.lease_lost:
                return False
            return plan.policy.give_back(plan.model, d.message, deliver_time=deliver_time)

        try:
            with self.leases.write(plan, give_back) as (_, given):
                if given:
                    self.reporter.emit("released", message=d.message)
        except LeaseLost:
            self.log("lease_lost", d.message, None, "%s: lease lost before release")
        except Exception:
            logger.exception(
                "%s: release failed; left to lease expiry",
                d.message,
                extra=self.reporter.log_extra("error", d.message),
            )

    # --- the one report ----------------------------------------------------------------------
    def report(
        self,
        name: str,
        o: Outcome,
        *,
        message: Message | None = None,
        error: BaseException | None = None,
    ) -> None:
        """Report ``o`` by its row of ``REPORTS``: count, log, emit."""
        row = REPORTS[name]
        reporter = self.reporter
        m = message or o.delivery.message
        error = error or o.error
        if row.counter:
            reporter.count(row.counter)
        level = row.level
        more: dict[str, Any] = {}
        if name == "unmatched":
            miss = miss_kind(o.delivery.plan.specs, m)
            more["miss"] = miss
            with self._mismatch_lock:
                first = (m.queue, miss) not in self.mismatches
                if first and len(self.mismatches) < MISMATCHES_REMEMBERED:
                    self.mismatches.add((m.queue, miss))
            if not first:
                level = logging.DEBUG
        if logger.isEnabledFor(level):
            fields = {
                "message": m,
                "attempt": m.attempt or 0,
                "receiver": o.receiver or "(no receiver)",
                "error": error,
                "error_type": type(error).__name__,
                "after": (
                    error.after
                    if isinstance(error, Retry) and error.after is not None
                    else "the back-off"
                ),
                "reason": f" ({error.reason})" if isinstance(error, Retry) and error.reason else "",
                "queue": o.delivery.plan.options.dead_letter_queue,
                "key": m.key,
                "parked": f"{PARKED_UNTIL:%Y-%m-%d}",
                "size": len(m.payload),
                **more,
            }
            logger.log(
                level,
                row.text,
                fields,
                exc_info=error if row.traceback else None,
                extra=reporter.log_extra(name, m, o.duration, **more),
            )
        if row.event:
            reporter.emit(
                row.event,
                message=m,
                receiver=o.receiver,
                duration=o.duration,
                error=error,
                acked=o.acked,
            )

    def log(self, action: str, m: Message, duration: float | None, text: str) -> None:
        """A warning about ``m`` that is no settlement (a write found the message gone)."""
        logger.warning(text, m, extra=self.reporter.log_extra(action, m, duration))

    def missed(self, message: Message) -> int:
        """Count one more miss of ``message`` (no receiver matched it); return its misses in
        this worker. At most ``MISSES_REMEMBERED`` messages are remembered, the least recently
        missed forgotten first (its back-off starts again)."""
        key = (message.queue, message.key)
        with self._mismatch_lock:
            misses = self.misses.pop(key, 0) + 1
            self.misses[key] = misses
            while len(self.misses) > MISSES_REMEMBERED:
                self.misses.popitem(last=False)
        return misses

    # --- at stop: what was never started ---------------------------------------------------
    def return_unstarted(self, unit: list[Delivery]) -> list[Delivery]:
        """At stop: give back prefetched messages that were not started, due now, without
        spending one of their attempts (``DeliveryPolicy.return_unstarted``: the claim counted
        one; a release would keep it, and enough graceful stops would then dead-letter a
        message that never ran). Returns the deliveries to run now (a later delivery, which
        failed before, so that its attempt is one that ran; and those whose lease was lost: to
        be reported by the run)."""
        run_now = []
        for d in unit:
            plan = d.plan

            def give_back(d: Delivery = d, plan: Plan = plan) -> Unstarted | None:
                if d.lease_lost:
                    return None
                return plan.policy.return_unstarted(plan.model, d.message, using=plan.db)

            try:
                with self.leases.write(plan, give_back) as (_, done):
                    pass
            except (LeaseLost, MessageAlreadyAcked):
                self.log("lease_lost", d.message, None, "%s: lease lost before it was given back")
                continue
            except Exception:
                logger.exception(
                    "%s: giving it back failed; left to lease expiry",
                    d.message,
                    extra=self.reporter.log_extra("error", d.message),
                )
                continue
            # None: the lease was lost, reported (and not run) by the run below
            if done is None or done is Unstarted.RUN:
                run_now.append(d)
                continue
            if done is Unstarted.KEPT:
                continue  # left to its lease expiry
            self.report("returned", Outcome(Kind.LEASE_LOST, d))
        return run_now


def miss_kind(specs: Sequence[ReceiverSpec], message: Message) -> str:
    """What ``message`` carries in the fields the ``match=`` of ``specs`` look at, as text
    (``"kind='refund'"``): the kind of message this worker has no receiver for."""
    names = sorted({name for spec in specs for name in (spec.match or {})})
    key = message.key_dict
    data: Any = None
    parts = []
    for name in names:
        if name in key:
            parts.append(f"{name}={key[name]!r:.80}")
            continue
        if data is None:
            try:
                data = message.json()
            except Exception:
                data = {}
        if isinstance(data, Mapping) and name in data:
            parts.append(f"{name}={data[name]!r:.80}")
        else:
            parts.append(f"no {name}")
    return ", ".join(parts) or "(no match fields)"

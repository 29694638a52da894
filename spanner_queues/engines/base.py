"""The engine seam: everything above it (send API, outbox, worker, admin, checks, migrations)
talks to a ``BaseQueueEngine`` and branches only on ``engine.features``."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from django.core import checks

from spanner_queues import clock
from spanner_queues.conf import COMMON_OPTIONS, EngineParams
from spanner_queues.exceptions import InvalidMessage, InvalidQueueEngine, NotSupportedByEngine
from spanner_queues.message import LATEST_DELIVER_TIME, OutgoingMessage, may_have_failed
from spanner_queues.options import queue_options
from spanner_queues.transactions import run_in_transaction

if TYPE_CHECKING:
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

    from spanner_queues.message import Message
    from spanner_queues.models import Queue
    from spanner_queues.options import QueueOptions


logger = logging.getLogger("spanner_queues.engines")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineFeatures:
    """What an engine can do. Callers and tests gate on these flags, never on vendors."""

    supports_native_queues: bool = False
    supports_lease_renewal: bool = True
    supports_release: bool = True
    #: whether ``receive(lease=...)`` sets the lease length (Spanner's lease is always 10 s).
    supports_custom_lease: bool = True
    supports_attempt_count: bool = True
    supports_listing: bool = True
    #: whether ``renew_leases`` rotates the token (Spanner's RENEWLEASE does).
    rotates_lease_tokens: bool = True
    #: whether the queue stores the bookkeeping fields (``send_time``, ``attempts``,
    #: ``lease_token``, ``lease_expires_at``); when False the ORM neither reads nor writes them.
    stores_bookkeeping_fields: bool = True
    #: whether ``ack_many`` accepts ``lease_tokens`` and refuses a stale ack (``StaleAck``)
    #: instead of deleting a newer message sent under the same key. Native Spanner acks by key.
    supports_lease_checked_ack: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStats:
    """Counts for one queue at ``measured_at``. ``scheduled`` counts messages not yet due
    (future deliver time or back-off after an expired lease); ``leased`` those in flight."""

    queue: str
    total: int
    ready: int
    scheduled: int
    leased: int
    oldest_send_time: datetime | None
    max_attempts: int | None
    measured_at: datetime

    @property
    def oldest_age(self) -> timedelta | None:
        if self.oldest_send_time is None:
            return None
        return max(self.measured_at - self.oldest_send_time, timedelta(0))


@dataclass(frozen=True, slots=True)
class Failure:
    """What ``fail`` decided about a failed run: the number of the attempt that failed, and
    whether it was the last one allowed (``QueueMeta.max_attempts``): then the message is
    dead-lettered or discarded, else given back due after the back-off."""

    attempt: int | None
    exhausted: bool


#: what ``return_unstarted`` did: given back due now, to be run now (giving it back would spend
#: an attempt that never ran), or kept (left to its lease expiry: the engine cannot give back)
Unstarted = Literal["returned", "run", "kept"]


class BaseQueueEngine(ABC):
    """One way of realising queues. Methods take the queue model first.

    Guarantees every engine keeps (the conformance suite checks them):
    - ``send_many`` writes through the caller's connection, in the caller's transaction.
    - ``receive`` never hands a message to two receivers while a lease on it is live, and never
      before its deliver time.
    - ``ack`` deletes by key in the caller's transaction; no row raises ``MessageAlreadyAcked``,
      and the caller's transaction is then marked for rollback (never catch and continue).
    """

    features: ClassVar[EngineFeatures] = EngineFeatures()
    #: engine-specific keys accepted in ``SPANNER_QUEUES[alias]["OPTIONS"]`` besides the common
    #: ones (LEASE_SECONDS, BACKOFF, MAX_PAYLOAD_BYTES, TRANSACTION_RETRIES).
    accepted_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, params: EngineParams) -> None:
        unknown = sorted(set(params.options) - self.accepted_options)
        if unknown:
            known = sorted(self.accepted_options | COMMON_OPTIONS)
            raise InvalidQueueEngine(
                f"SPANNER_QUEUES[{params.alias!r}]['OPTIONS'] has unknown keys for "
                f"{type(self).__name__}: {', '.join(unknown)}. Known: {', '.join(known)}."
            )
        self.params = params

    @property
    def alias(self) -> str:
        return self.params.alias

    @property
    def database(self) -> str:
        return self.params.database

    def _unsupported(self, verb: str) -> NotSupportedByEngine:
        return NotSupportedByEngine(f"The {type(self).__name__} engine does not support {verb}.")

    # --- schema ---------------------------------------------------------------------------
    @abstractmethod
    def create_queue(
        self,
        schema_editor: BaseDatabaseSchemaEditor,
        model: type[Queue],
        options: QueueOptions,
    ) -> None:
        """Create the queue's storage (run by the ``CreateQueue`` migration operation)."""

    @abstractmethod
    def drop_queue(
        self,
        schema_editor: BaseDatabaseSchemaEditor,
        model: type[Queue],
        options: QueueOptions,
    ) -> None:
        """Drop the queue's storage."""

    # --- messages -------------------------------------------------------------------------
    @abstractmethod
    def send_many(
        self, model: type[Queue], messages: Sequence[OutgoingMessage], *, using: str
    ) -> list[Message]:
        """Insert messages in the caller's transaction on ``using``."""

    @abstractmethod
    def receive(
        self, model: type[Queue], *, max_messages: int = 1, lease: timedelta | None = None
    ) -> list[Message]:
        """Lease up to ``max_messages`` due messages; an empty list when none is due."""

    @abstractmethod
    def ack_many(self, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str) -> None:
        """Delete messages by key in the caller's transaction; all or ``MessageAlreadyAcked``."""

    def ack_messages(self, model: type[Queue], messages: Sequence[Message], *, using: str) -> None:
        """Ack received messages in the caller's transaction with the leases they carry (where
        ``supports_lease_checked_ack``, a message whose row no longer holds its token raises
        ``StaleAck``; one without a token is acked by key), and forget their recorded failures.
        All or nothing; on failure the caller's transaction is marked for rollback."""
        if not messages:
            return
        self._ack_held(model, messages, using=using)
        failed_before = [m.key for m in messages if may_have_failed(m)]
        if failed_before:
            self.clear_failures(model, failed_before, using=using)

    def requeue(
        self,
        model: type[Queue],
        messages: Sequence[Message],
        outgoing: Sequence[OutgoingMessage],
        *,
        using: str,
        to: type[Queue] | None = None,
        missing_ok: bool = False,
    ) -> list[Message]:
        """Ack ``messages`` and send ``outgoing`` (to ``to``, default the same queue) in the
        caller's transaction on ``using``: both or neither. The ack is the one of
        ``ack_messages`` (lease-checked where the engine can; ``MessageAlreadyAcked`` or
        ``StaleAck`` and nothing is sent). The new messages start afresh: no delivery
        counted, and the failures recorded of a message that failed before, or that moves to
        another queue, are forgotten. With ``missing_ok`` whatever is under the keys is
        deleted, held or not, a missing message is no error and recorded failures stay
        (``api.replace``: no lease is held)."""
        keys = [m.key for m in messages]
        if missing_ok:
            self.delete_any(model, keys, using=using)
        elif messages:
            self._ack_held(model, messages, using=using)
        moved = to is not None and to is not model
        forget = keys if moved else [m.key for m in messages if may_have_failed(m)]
        if forget:
            self.clear_failures(model, forget, using=using)
        return self.send_many(to or model, outgoing, using=using) if outgoing else []

    def _ack_held(self, model: type[Queue], messages: Sequence[Message], *, using: str) -> None:
        self.ack_keys(
            model, [m.key for m in messages], [m.lease_token for m in messages], using=using
        )

    def ack_keys(
        self,
        model: type[Queue],
        keys: Sequence[tuple[Any, ...]],
        lease_tokens: Sequence[str | None],
        *,
        using: str,
    ) -> None:
        """``ack_many`` with each key's lease token (None: by key alone) where the engine
        checks leases (``supports_lease_checked_ack``: a row that no longer holds its token
        raises ``StaleAck``); by key alone where it does not (native Spanner)."""
        if self.features.supports_lease_checked_ack:
            # the lease-checking engines' ack_many takes lease_tokens; the base verb does not
            self.ack_many(model, keys, using=using, lease_tokens=lease_tokens)  # type: ignore[call-arg]
        else:
            self.ack_many(model, keys, using=using)

    def discard(self, model: type[Queue], messages: Sequence[Message], *, using: str) -> None:
        """Drop messages whose attempts are exhausted (``discard_after_max_attempts``) in the
        caller's transaction: ack them as ``ack_messages`` does and forget every failure
        recorded of them (the failed run just recorded included)."""
        if not messages:
            return
        self._ack_held(model, messages, using=using)
        self.clear_failures(model, [m.key for m in messages], using=using)

    def delete_any(
        self, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str
    ) -> None:
        """Delete whatever messages are under ``keys`` in the caller's transaction, held or
        not; a missing one is no error."""
        raise self._unsupported("deleting by key")

    def renew_leases(self, model: type[Queue], messages: Sequence[Message]) -> list[Message]:
        """Extend leases; return the renewed messages (new token, new expiry). Messages whose
        lease was lost are left out of the result."""
        raise self._unsupported("lease renewal")

    def release(
        self, model: type[Queue], message: Message, *, deliver_time: datetime | None = None
    ) -> None:
        """Give a leased message back, due at ``deliver_time`` (default now)."""
        raise self._unsupported("release")

    def record_failure(
        self, model: type[Queue], message: Message, error: BaseException | None, *, using: str
    ) -> int | None:
        """Count a failed run of ``message`` in the caller's transaction; return the number of
        the attempt that failed. Engines that count deliveries (``supports_attempt_count``)
        already have it in ``message.attempt`` and write nothing (None: not known)."""
        return message.attempt

    def clear_failures(
        self, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str
    ) -> None:
        """Forget recorded failures of ``keys`` in the caller's transaction (acked,
        dead-lettered or discarded). Nothing to do where attempts are counted on the rows."""
        return None

    # --- attempts, back-off and giving back (the worker's outcome policy asks these) ----------
    def backoff(self, message: Message) -> timedelta:
        """How long a message waits before its next delivery after ``message.attempt`` failed
        (``SPANNER_QUEUES[alias]["OPTIONS"]["BACKOFF"]``; hourly once it is old)."""
        age = clock.now() - (message.send_time or clock.now())
        return self.params.backoff.delay(max(message.attempt or 1, 1), age)

    def exhausted(self, model: type[Queue], message: Message) -> bool:
        """Whether ``message`` was delivered more often than ``QueueMeta.max_attempts`` allows
        (runs lost to lease expiry count): it must not run again."""
        limit = queue_options(model).max_attempts
        return bool(limit and (message.attempt or 0) > limit)

    def fail(
        self, model: type[Queue], message: Message, error: BaseException | None, *, using: str
    ) -> Failure:
        """Count a failed run of ``message`` (``record_failure``, in a transaction of its own;
        if that fails, it is logged and the delivery's attempt number stands) and say whether
        it was the last attempt allowed."""
        attempt: int | None
        try:
            attempt = run_in_transaction(
                lambda: self.record_failure(model, message, error, using=using),
                using=using,
                retries=self.params.transaction_retries,
            )
        except Exception:
            logger.exception("%s: recording the failure failed", message)
            attempt = message.attempt
        limit = queue_options(model).max_attempts
        return Failure(
            attempt=attempt, exhausted=bool(limit and attempt is not None and attempt >= limit)
        )

    def give_back(
        self, model: type[Queue], message: Message, *, deliver_time: datetime | None = None
    ) -> bool:
        """Give a held message back before its lease ends, due at ``deliver_time`` (default:
        after the back-off for its attempt). False where the engine cannot release
        (``supports_release``): the message then comes back after its lease. ``LeaseLost`` if
        the lease is no longer held."""
        if not self.features.supports_release:
            return False
        due = deliver_time or clock.now() + self.backoff(message)
        self.release(model, message, deliver_time=due)
        return True

    def return_unstarted(self, model: type[Queue], message: Message, *, using: str) -> Unstarted:
        """Give back a received message that was never run, due now, without spending one of
        its attempts (the delivery counted one; enough graceful stops would otherwise
        dead-letter a message that never ran):

        - engines that count deliveries: a first delivery is acked and sent again under its
          key in one transaction (``requeue``: attempts back to 0); a later one (it failed
          before) is to be ``"run"`` now, so that its attempt is one that ran;
        - the others (attempts are failed runs, not deliveries): released due now, or
          ``"kept"`` (left to its lease expiry) where the engine cannot release.
        """
        if not self.features.supports_attempt_count:
            given = self.give_back(model, message, deliver_time=clock.now())
            return "returned" if given else "kept"
        if may_have_failed(message):
            return "run"
        again = OutgoingMessage(key=message.key_dict, payload=message.payload)
        run_in_transaction(
            lambda: self.requeue(model, [message], [again], using=using),
            using=using,
            retries=self.params.transaction_retries,
        )
        return "returned"

    def retry(
        self,
        model: type[Queue],
        messages: Sequence[Message],
        *,
        after: timedelta | None,
        using: str,
    ) -> list[Message]:
        """``raise Retry(after=...)``: ``requeue`` each message under its key with its
        payload, due ``after`` from now (default: after its back-off), in the caller's
        transaction."""
        now = clock.now()
        again = []
        for m in messages:
            due = now + (after if after is not None else self.backoff(m))
            if due > LATEST_DELIVER_TIME:
                raise InvalidMessage(
                    f"{m}: retry due {due}, after {LATEST_DELIVER_TIME:%Y-%m-%d}, the latest a "
                    "queue accepts."
                )
            again.append(OutgoingMessage(key=m.key_dict, payload=m.payload, deliver_time=due))
        return self.requeue(model, messages, again, using=using)

    def stop_receiving(
        self, model: type[Queue] | None = None, *, wait: float | None = None
    ) -> None:
        """Stop receiving ``model`` (every queue when None) in this process: engines that
        receive through a background stream end it; for the others there is nothing to stop."""
        return None

    def settle_receiving(self, model: type[Queue], *, wait: float | None = None) -> bool:
        """For a caller that stops once nothing is due (a burst worker), before it stops:
        True once no row of ``model`` is leased to this process and unread, False while some
        may be (the next ``receive`` hands them out: process them and ask again). Engines
        that receive through a background stream let its open call end (``wait`` seconds at
        most) rather than cancel rows on the wire, and from the first call on keep their
        calls short. Engines that lease only inside ``receive`` hold nothing unread: True."""
        return True

    def lease_expirations(self, model: type[Queue]) -> int:
        """Leases on ``model``'s messages that ran out without an ack or release, as this
        process saw them since it started (a counter, for Spanner's ``lease_expiration_count``
        metric). Engines that cannot see expirations return 0."""
        return 0

    @abstractmethod
    def stats(self, model: type[Queue]) -> QueueStats:
        """Counts of the queue's messages by state."""

    def check(self) -> list[checks.CheckMessage]:
        return []

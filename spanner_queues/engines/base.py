"""The engine seam: everything above it (send API, outbox, worker, admin, checks, migrations)
talks to a ``BaseQueueEngine`` and branches only on ``engine.features``.

The seam is storage only: one verb per change to a queue's storage (create/drop, send,
receive, ack, delete, requeue, release, renew, recording a failed run) and what can be read of it
(stats, lease expirations, checks). Back-off, attempts, giving back, dead-lettering and
discarding are the worker's delivery policy (``spanner_queues.worker.apply``), built on
these verbs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from django.core import checks

from spanner_queues.conf import COMMON_OPTIONS, EngineParams
from spanner_queues.exceptions import InvalidQueueEngine, NotSupportedByEngine
from spanner_queues.keys import key_names
from spanner_queues.message import OutgoingMessage
from spanner_queues.options import ordered_by

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

    from spanner_queues.message import Message
    from spanner_queues.models import Queue
    from spanner_queues.options import QueueOptions


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
    #: whether ``ack_many`` checks its ``lease_tokens`` and refuses a stale ack (``StaleAck``)
    #: instead of deleting a newer message sent under the same key. Native Spanner acks by key
    #: (the tokens are ignored).
    supports_lease_checked_ack: bool = False
    #: whether ``receive`` of an ordered queue (``QueueMeta.ordered_by``) hands out only each
    #: ordering key's head (no earlier message of its key exists); False: the worker keeps
    #: the order (``spanner_queues.ordering``)
    supports_ordered_receive: bool = False


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
        self,
        model: type[Queue],
        *,
        max_messages: int = 1,
        lease: timedelta | None = None,
        wait: float | None = None,
    ) -> list[Message]:
        """Lease up to ``max_messages`` due messages; an empty list when none is due.
        ``wait``: at most how many seconds an engine that is handed messages by a stream
        waits for the first (None: its own setting; 0: only what it holds now). An engine
        that asks a query for them answers at once and never waits."""

    @abstractmethod
    def ack_many(
        self,
        model: type[Queue],
        keys: Sequence[tuple[Any, ...]],
        *,
        using: str,
        lease_tokens: Sequence[str | None] | None = None,
    ) -> None:
        """Delete messages by key in the caller's transaction, all or none, with whatever the
        engine records of them (the failure ledger's records): a missing one raises
        ``MessageAlreadyAcked``. ``lease_tokens`` gives each key's lease (None: by key
        alone); where the engine checks leases (``supports_lease_checked_ack``) a row that no
        longer holds its token is not deleted (``StaleAck``), elsewhere the tokens are
        ignored (native Spanner acks by key). On either error the caller's transaction is
        marked for rollback."""

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
        caller's transaction on ``using``: both or neither. The ack is ``ack_many`` with the
        leases the messages carry (``MessageAlreadyAcked`` or ``StaleAck`` and nothing is
        sent). The new messages start afresh: no delivery counted, no failure on record. With
        ``missing_ok`` whatever is under the keys is deleted, held or not (``delete_any``),
        and a missing message is no error (``api.replace``: no lease is held). On an ordered
        queue (``QueueMeta.ordered_by``) a message sent again under its key to the same queue
        keeps its place among its key's messages (its ``send_time``)."""
        keys = [m.key for m in messages]
        if not missing_ok and (to is None or to is model) and ordered_by(model):
            unplaced = [m.key for m in messages if m.send_time is None]
            places = self.recorded_places(model, unplaced, using=using) if unplaced else {}
            outgoing = kept_in_place(model, messages, outgoing, places)
        if missing_ok:
            self.delete_any(model, keys, using=using)
        elif messages:
            self.ack_many(model, keys, using=using, lease_tokens=[m.lease_token for m in messages])
        return self.send_many(to or model, outgoing, using=using) if outgoing else []

    def recorded_places(
        self, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str
    ) -> dict[tuple[Any, ...], datetime]:
        """The send times (places in their ordering keys) the engine keeps of the messages
        under ``keys`` of an ordered queue, by key, where a received message does not carry
        it (``Message.send_time`` None); none by default."""
        return {}

    def delete_any(
        self, model: type[Queue], keys: Sequence[tuple[Any, ...]], *, using: str
    ) -> None:
        """Delete whatever messages are under ``keys`` in the caller's transaction, held or
        not, with whatever the engine records of them; a missing one is no error."""
        raise self._unsupported("deleting by key")

    def renew_leases(self, model: type[Queue], messages: Sequence[Message]) -> list[Message]:
        """Extend leases; return the renewed messages (new token, new expiry). Messages whose
        lease was lost are left out of the result."""
        raise self._unsupported("lease renewal")

    def release(
        self, model: type[Queue], message: Message, *, deliver_time: datetime | None = None
    ) -> None:
        """Give a leased message back, due at ``deliver_time`` (default now); ``LeaseLost`` if
        its lease is no longer held."""
        raise self._unsupported("release")

    # --- failed runs (engines that count no deliveries keep a ledger) ------------------------
    def record_failure(
        self, model: type[Queue], message: Message, error: BaseException | None, *, using: str
    ) -> int | None:
        """Count a failed run of ``message`` in the caller's transaction; return the number of
        the attempt that failed. Engines that count deliveries (``supports_attempt_count``)
        already have it in ``message.attempt`` and write nothing (None: not known)."""
        return message.attempt

    # --- receiving in the background ---------------------------------------------------------
    def stop_receiving(
        self, model: type[Queue] | None = None, *, wait: float | None = None
    ) -> None:
        """Stop receiving ``model`` (every queue when None) in this process: engines that
        receive through a background stream end it; for the others there is nothing to stop."""
        return None

    def settle_receiving(
        self,
        model: type[Queue],
        *,
        wait: float | None = None,
        ignore: Collection[tuple[Any, ...]] = (),
    ) -> bool:
        """For a caller that stops once nothing is due (a burst worker), before it stops:
        True once no row of ``model`` is leased to this process and unread and the engine
        last looked at the queue and found nothing due but messages keyed in ``ignore`` (the
        caller handled them already: given back, no receiver of its release matches them);
        False while rows may be leased and unread (the next ``receive`` hands them out:
        process them and ask again) or a look is still to come. Engines that receive through
        a background stream (whose ``receive(wait=0)`` hands out what it holds without
        looking) look in a call of their own, let an open call end (``wait`` seconds at
        most) rather than cancel rows on the wire, and from the first call on keep their
        calls short. Engines that lease only inside ``receive`` look in every ``receive``
        and hold nothing unread: True."""
        return True

    def lease_expirations(self, model: type[Queue]) -> int:
        """Leases on ``model``'s messages that ran out without an ack or release, as this
        process saw them since it started (a counter, for Spanner's ``lease_expiration_count``
        metric). Engines that cannot see expirations return 0."""
        return 0

    def deliver_time_moves(self, model: type[Queue]) -> int:
        """Deliveries of ``model`` this process saw whose ``DeliverTime`` was later than their
        lease's start (a counter: proof that the store moves ``DeliverTime`` on a lease, which
        Google does not document for Spanner; the engine's failure ledger then fails closed).
        Engines that keep their own delivery count return 0."""
        return 0

    @abstractmethod
    def stats(self, model: type[Queue]) -> QueueStats:
        """Counts of the queue's messages by state."""

    def check(self) -> list[checks.CheckMessage]:
        return []

    def connection_created(
        self, connection: BaseDatabaseWrapper, queue_tables: Callable[[], set[str]]
    ) -> None:
        """A connection to this engine's database was opened (Django's ``connection_created``,
        hooked by ``spanner_queues.introspection``). An engine whose queues are not tables
        keeps them out of Django's table listings here; ``queue_tables()`` gives the
        lower-cased table names of the queues declared on it. Nothing by default."""
        return None


class SpannerSQL(Protocol):
    """The names a Spanner dialect gives a queue's objects (``engines.spanner_sql``)."""

    name: str

    def quote(self, name: str) -> str: ...

    def receive_function(self, queue: str) -> str: ...

    def renew_function(self, queue: str) -> str: ...


def kept_in_place(
    model: type[Queue],
    messages: Sequence[Message],
    outgoing: Sequence[OutgoingMessage],
    places: Mapping[tuple[Any, ...], datetime],
) -> list[OutgoingMessage]:
    """``outgoing``, each one sent again under the key of one of ``messages`` carrying that
    message's ``send_time``: its place among its ordering key's messages (``places``, by
    key, where a message carries none)."""
    names = key_names(model)
    times = {**places, **{m.key: m.send_time for m in messages if m.send_time is not None}}
    out = []
    for o in outgoing:
        at = o.send_time or times.get(tuple(o.key[n] for n in names))
        out.append(o if at is o.send_time else replace(o, send_time=at))
    return out

"""What an operator can do to messages, each through the send API or the dead-letter verbs
(and ``api.cancel``).

Every action runs in one transaction on the queue's database, together with its admin history
(``LogEntry``): for a selection, all messages change or none does. Nothing here updates a row.
"Deliver now" and "reschedule" ack each message and send it again, same key and payload, at the
new time; unlike ``api.replace``, every action (ack included) first checks, in the same
transaction, that each message is still the one shown (same payload and send time), so a
message acked or replaced by a receiver since the page was shown is neither resurrected,
overwritten nor deleted (the action fails, changes nothing). Acks carry the lease the message
was shown with (``StaleAck`` on the table engine if a receiver took it since).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.utils import timezone

from spanner_queues import api, deadletter
from spanner_queues.admin.browse import key_token
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import MessageAlreadyAcked
from spanner_queues.keys import key_filter, row_to_message
from spanner_queues.message import Message
from spanner_queues.models import Queue
from spanner_queues.storage import rows
from spanner_queues.transactions import run_in_transaction

VIEW_PERMISSION = "spanner_queues.view_queues"


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the operator gave an action: a deliver time (reschedule), a reason and who they
    are (cancel)."""

    deliver_time: datetime | None = None
    reason: str = ""
    by: str = ""


Apply = Callable[[type[Queue], Sequence[Message], Inputs, str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueAction:
    """One action of the message browser; ``name`` is the form value."""

    name: str
    label: str
    button: str
    done: str
    explanation: str
    permission: str
    log_flag: int
    apply: Apply
    available: Callable[[type[Queue]], bool]
    needs_time: bool = False
    #: the operator gives a reason (cancel)
    needs_reason: bool = False

    def allowed(self, user: object) -> bool:
        return bool(getattr(user, "has_perm", lambda _: False)(self.permission))

    def change_message(
        self, model: type[Queue], deliver_time: datetime | None, reason: str = ""
    ) -> str:
        when = timezone.localtime(deliver_time).isoformat() if deliver_time else ""
        target = dead_letter_target(model)
        return self.done.format(
            when=when, target=target or "", source=replay_target(model) or "", reason=reason
        )


def dead_letter_target(model: type[Queue]) -> str | None:
    target = deadletter.dead_letter_queue_for(model)
    return target._meta.label if target else None


def replay_target(model: type[Queue]) -> str | None:
    sources = deadletter.sources_of(model)
    return sources[0]._meta.label if len(sources) == 1 else None


def _unchanged(model: type[Queue], messages: Sequence[Message], db: str) -> None:
    """Inside the action's transaction: each message is still the one the operator saw. A
    receiver may have acked it and sent a new one under the same key since (checkpoint, Retry,
    a periodic run): acting on the shown payload would then overwrite newer state."""
    for message in messages:
        row = rows(model, db).filter(key_filter(model, message.key)).first()
        current = row_to_message(model, row) if row is not None else None
        if (
            current is None
            or current.payload != message.payload
            or (message.send_time is not None and current.send_time != message.send_time)
        ):
            raise MessageAlreadyAcked(
                f"{message} changed since the page was shown (acked, or replaced by a newer "
                "message under the same key); nothing was done. Reload and try again."
            )


def _ack(model: type[Queue], messages: Sequence[Message], _: Inputs, db: str) -> None:
    _unchanged(model, messages, db)
    api.ack_many(model, messages, using=db)


def _resend(model: type[Queue], messages: Sequence[Message], given: Inputs, db: str) -> None:
    _unchanged(model, messages, db)
    api.requeue_many(messages, deliver_time=given.deliver_time, using=db)


def _dead_letter(model: type[Queue], messages: Sequence[Message], _: Inputs, db: str) -> None:
    _unchanged(model, messages, db)
    for message in messages:
        deadletter.dead_letter(message, using=db)


def _replay(model: type[Queue], messages: Sequence[Message], _: Inputs, db: str) -> None:
    _unchanged(model, messages, db)
    for message in messages:
        deadletter.replay(message, using=db)


def _cancel(model: type[Queue], messages: Sequence[Message], given: Inputs, db: str) -> None:
    _unchanged(model, messages, db)
    for message in messages:
        api.cancel(model, message.key, reason=given.reason, by=given.by, using=db)


def _always(model: type[Queue]) -> bool:
    return True


ACTIONS: dict[str, QueueAction] = {
    a.name: a
    for a in (
        QueueAction(
            name="ack",
            label="Ack (delete) selected messages",
            button="Ack (delete)",
            done="Acked (deleted)",
            explanation="Each message is acked: deleted from the queue, as a receiver's ack "
            "does. A receiver holding a lease on it will fail to ack it.",
            permission="spanner_queues.ack_message",
            log_flag=DELETION,
            apply=_ack,
            available=_always,
        ),
        QueueAction(
            name="deliver_now",
            label="Deliver selected messages now",
            button="Deliver now",
            done="Delivered now (acked and sent again)",
            explanation="Each message is acked and sent again with the same key and payload, "
            "due now, in one transaction. Its attempt count starts again from zero; a lease on "
            "it is cancelled.",
            permission="spanner_queues.reschedule_message",
            log_flag=CHANGE,
            apply=_resend,
            available=_always,
        ),
        QueueAction(
            name="reschedule",
            label="Reschedule selected messages…",
            button="Reschedule…",
            done="Rescheduled to {when} (acked and sent again)",
            explanation="Each message is acked and sent again with the same key and payload, "
            "due at the time you choose, in one transaction. Its attempt count starts again "
            "from zero; a lease on it is cancelled. A time in the past means now.",
            permission="spanner_queues.reschedule_message",
            log_flag=CHANGE,
            apply=_resend,
            available=_always,
            needs_time=True,
        ),
        QueueAction(
            name="dead_letter",
            label="Move selected messages to the dead-letter queue",
            button="Move to the dead-letter queue",
            done="Moved to the dead-letter queue {target}",
            explanation="Each message is acked and sent, same key and payload, to this queue's "
            "dead-letter queue, in one transaction.",
            permission="spanner_queues.dead_letter_message",
            log_flag=CHANGE,
            apply=_dead_letter,
            available=lambda model: dead_letter_target(model) is not None,
        ),
        QueueAction(
            name="replay",
            label="Replay selected messages to their queue",
            button="Replay to its queue",
            done="Replayed to {source}",
            explanation="Each message is acked from this dead-letter queue and sent again, same "
            "key and payload, to the queue it came from, in one transaction.",
            permission="spanner_queues.dead_letter_message",
            log_flag=CHANGE,
            apply=_replay,
            available=lambda model: replay_target(model) is not None,
        ),
        QueueAction(
            name="cancel",
            label="Cancel selected messages…",
            button="Cancel…",
            done="Cancelled ({reason})",
            explanation="Each message is cancelled, with your name and reason on record: a "
            "pending one is deleted; one a worker runs now is asked to stop (its receiver sees "
            "it if it checks, else its time limit stops it).",
            permission="spanner_queues.cancel_message",
            log_flag=CHANGE,
            apply=_cancel,
            available=_always,
            needs_reason=True,
        ),
    )
}


def actions_for(model: type[Queue], user: object) -> list[QueueAction]:
    """The actions that apply to ``model`` and that ``user`` may run."""
    return [a for a in ACTIONS.values() if a.available(model) and a.allowed(user)]


def perform(
    action: QueueAction,
    model: type[Queue],
    messages: Sequence[Message],
    *,
    user_id: Any,
    deliver_time: datetime | None = None,
    reason: str = "",
    by: str = "",
) -> None:
    """Run ``action`` on ``messages`` and record it in the admin history (as the user whose
    primary key is ``user_id``, of whatever type ``AUTH_USER_MODEL``'s is), in one transaction.
    A ``QueueError`` (e.g. ``MessageAlreadyAcked``) rolls everything back. ``reason`` and
    ``by`` (the user's name): a cancel's record."""
    db = engine_for(model).database
    content_type = ContentType.objects.db_manager(db).get_for_model(model, for_concrete_model=False)
    change_message = action.change_message(model, deliver_time, reason) + "."
    given = Inputs(deliver_time=deliver_time, reason=reason, by=by)

    def run() -> None:
        action.apply(model, messages, given, db)
        # the history goes through the queue's database, in the action's transaction
        LogEntry.objects.using(db).bulk_create(
            LogEntry(
                user_id=user_id,
                content_type_id=content_type.pk,
                object_id=key_token(m.key),
                object_repr=str(m)[:200],
                action_flag=action.log_flag,
                change_message=change_message,
            )
            for m in messages
        )

    run_in_transaction(run, using=db, retries=engine_for(model).params.transaction_retries)

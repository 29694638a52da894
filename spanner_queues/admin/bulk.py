"""Search a queue's messages with one filter and act on all that match, in bounded batches.

``MessageFilter`` is the filter the admin's message browser, its bulk actions and
``manage.py queuemessages`` share: key columns (exact, and prefix on text columns), a payload
substring, attempts, a deliver time range and a state. It reads through the queue's rows
(``storage.rows``), so it works on every engine that lists messages
(``supports_listing``); what needs the bookkeeping columns (attempts, the leased and failing
states) is refused where the engine keeps none (``stores_bookkeeping_fields``: native queues).
The payload substring is matched on the payload's bytes as stored (UTF-8 of the text; canonical
JSON, keys sorted, no spaces) in this process, page by page, the same on every engine and
payload type; there is no JSON path (a query on a JSON column differs per database, and the
engines expose none).

``run_bulk`` acts on every matching message: it pages through them by primary key (keyset:
each page starts after the last key of the one before, so nothing is read twice or skipped,
and a message sent again under its key by the action is behind the cursor), and handles each
page in one transaction of at most ``batch_size`` messages (``BATCH_SIZE``: a few thousand
mutations, far below Spanner's 80,000 per commit; the re-read of a page is one query of
``batch_size`` times the key columns in parameters, at most 950). In that transaction each
message is read again and acted on only if it is still the one read (same payload, send
time, deliver time, attempts and lease token) and not leased now: one a worker leased, acked
or replaced meanwhile is skipped and counted, never doubled or lost. The actions are the
verbs of the single-message actions (``api.ack_many``, ``api.requeue_many``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.db import DatabaseError, models
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from spanner_queues import api, clock
from spanner_queues.admin.actions import ACTIONS, QueueAction
from spanner_queues.admin.browse import (
    LEASED,
    READY,
    SCHEDULED,
    has_bookkeeping,
    key_token,
    messages_queryset,
    parse_key_token,
    state_filter,
)
from spanner_queues.deadletter import sources_of
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import InvalidArgument, QueueError
from spanner_queues.keys import key_fields, key_filter, key_names, row_to_message
from spanner_queues.queues import queue_models
from spanner_queues.transactions import run_in_transaction

if TYPE_CHECKING:
    from spanner_queues.message import Message
    from spanner_queues.models import Queue

#: messages per transaction; at most ``950 // key columns`` (the re-read's parameters)
BATCH_SIZE = 200
#: the longest payload substring searched for
MAX_TEXT = 200
FAILING, DEAD_LETTERED = "failing", "dead_lettered"
#: the filter's states: the browser's three, failing (attempted, not leased) and dead-lettered
#: (every message of a dead-letter queue)
FILTER_STATES = (READY, SCHEDULED, LEASED, FAILING, DEAD_LETTERED)
_NEEDS_BOOKKEEPING = (LEASED, FAILING)

#: the operations, each with the single-message action whose permission it needs
OPERATIONS: dict[str, str] = {
    "retry": "deliver_now",
    "delay": "reschedule",
    "delete": "ack",
    "move": "replay",
}
OPERATION_LABELS = {
    "retry": "Deliver now",
    "delay": "Deliver at a time",
    "delete": "Ack (delete)",
    "move": "Move to another queue",
}

OPERATION_EXPLANATIONS = {
    "retry": "Each message is acked and sent again with the same key and payload, due now. Its "
    "attempt count starts again from zero.",
    "delay": "Each message is acked and sent again with the same key and payload, due at the "
    "time you choose (a time in the past means now). Its attempt count starts again from zero.",
    "delete": "Each message is acked: deleted from the queue, as a receiver's ack does.",
    "move": "Each message is acked here and sent, same key and payload, due now, to the queue "
    "you choose (on a dead-letter queue, the queue it came from is preselected).",
}


def permission_action(operation: str) -> QueueAction:
    """The single-message action whose permission ``operation`` needs (``QueueAction.allowed``)."""
    return ACTIONS[OPERATIONS[operation]]


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """Which messages of a queue: every given condition holds (an empty filter: all)."""

    key: tuple[tuple[str, Any], ...] = ()
    key_prefix: tuple[tuple[str, str], ...] = ()
    text: str = ""
    min_attempts: int | None = None
    max_attempts: int | None = None
    deliver_after: datetime | None = None
    deliver_before: datetime | None = None
    state: str = ""

    # --- parameters (URL query, form fields, command options) ------------------------------
    @classmethod
    def from_params(cls, model: type[Queue], params: Mapping[str, str]) -> MessageFilter:
        """Parse ``key.<name>``, ``prefix.<name>``, ``text``, ``min_attempts``,
        ``max_attempts``, ``after``, ``before`` (ISO 8601) and ``state``; blank values are
        left out. ``InvalidArgument`` names what does not fit the queue or its engine."""
        fields = {f.attname: f for f in key_fields(model)}
        key: list[tuple[str, Any]] = []
        prefix: list[tuple[str, str]] = []
        for name, raw in params.items():
            value = raw.strip() if isinstance(raw, str) else raw
            if not value:
                continue
            kind, _, column = name.partition(".")
            if kind not in ("key", "prefix") or not column:
                continue
            if column not in fields:
                raise InvalidArgument(f"{model._meta.label} has no key column {column!r}.")
            if kind == "key":
                try:
                    key.append((column, fields[column].to_python(value)))
                except (ValidationError, ValueError, TypeError) as exc:
                    raise InvalidArgument(f"Not a value of key column {column}: {value}") from exc
            else:
                target = fields[column].target_field if fields[column].is_relation else None
                text_field = (models.CharField, models.TextField)
                if not isinstance(target or fields[column], text_field):
                    raise InvalidArgument(f"Key column {column} is not text: no prefix search.")
                prefix.append((column, value))
        flt = cls(
            key=tuple(key),
            key_prefix=tuple(prefix),
            text=(params.get("text") or "").strip(),
            min_attempts=_int(params.get("min_attempts"), "min_attempts"),
            max_attempts=_int(params.get("max_attempts"), "max_attempts"),
            deliver_after=_time(params.get("after"), "after"),
            deliver_before=_time(params.get("before"), "before"),
            state=(params.get("state") or "").strip(),
        )
        flt.check(model)
        return flt

    def params(self) -> dict[str, str]:
        """The parameters ``from_params`` reads back into this filter."""
        found = {f"key.{n}": str(v) for n, v in self.key}
        found |= {f"prefix.{n}": v for n, v in self.key_prefix}
        found |= {
            "text": self.text,
            "min_attempts": "" if self.min_attempts is None else str(self.min_attempts),
            "max_attempts": "" if self.max_attempts is None else str(self.max_attempts),
            "after": self.deliver_after.isoformat() if self.deliver_after else "",
            "before": self.deliver_before.isoformat() if self.deliver_before else "",
            "state": self.state,
        }
        return {k: v for k, v in found.items() if v}

    def describe(self) -> str:
        """The filter in words, for confirmations, logs and the admin history."""
        parts = [f"{n}={v}" for n, v in self.key]
        parts += [f"{n} starts with {v!r}" for n, v in self.key_prefix]
        if self.text:
            parts.append(f"payload contains {self.text!r}")
        if self.min_attempts is not None:
            parts.append(f"attempts ≥ {self.min_attempts}")
        if self.max_attempts is not None:
            parts.append(f"attempts ≤ {self.max_attempts}")
        if self.deliver_after:
            parts.append(f"due at or after {self.deliver_after.isoformat()}")
        if self.deliver_before:
            parts.append(f"due before {self.deliver_before.isoformat()}")
        if self.state:
            parts.append(f"state {self.state}")
        return ", ".join(parts) or "all messages"

    def check(self, model: type[Queue]) -> None:
        """``InvalidArgument`` if the queue or its engine cannot answer this filter."""
        if self.state and self.state not in FILTER_STATES:
            raise InvalidArgument(
                f"Unknown state {self.state!r}; one of {', '.join(FILTER_STATES)}."
            )
        if len(self.text) > MAX_TEXT:
            raise InvalidArgument(f"The payload text is limited to {MAX_TEXT} characters.")
        bookkeeping = has_bookkeeping(engine_for(model))
        uses_attempts = self.min_attempts is not None or self.max_attempts is not None
        if not bookkeeping and (uses_attempts or self.state in _NEEDS_BOOKKEEPING):
            raise InvalidArgument(
                f"{model._meta.label}'s engine keeps no attempts or leases on its rows "
                "(stores_bookkeeping_fields): no attempt or leased/failing filter."
            )
        if self.state == DEAD_LETTERED and not sources_of(model):
            raise InvalidArgument(f"{model._meta.label} is no queue's dead-letter queue.")

    # --- the query --------------------------------------------------------------------------
    def condition(self, model: type[Queue], now: datetime) -> Q:
        """The conditions the database checks (all but the payload text)."""
        bookkeeping = has_bookkeeping(engine_for(model))
        condition = Q(**dict(self.key))
        for name, value in self.key_prefix:
            condition &= Q(**{f"{name}__startswith": value})
        if self.min_attempts is not None:
            condition &= Q(attempts__gte=self.min_attempts)
        if self.max_attempts is not None:
            condition &= Q(attempts__lte=self.max_attempts)
        if self.deliver_after:
            condition &= Q(deliver_time__gte=self.deliver_after)
        if self.deliver_before:
            condition &= Q(deliver_time__lt=self.deliver_before)
        if self.state in (READY, SCHEDULED, LEASED):
            condition &= state_filter(self.state, now, bookkeeping=bookkeeping)
        elif self.state == FAILING:
            condition &= Q(attempts__gt=0) & ~Q(lease_expires_at__gt=now)
        return condition

    def matches_payload(self, message: Message) -> bool:
        return not self.text or self.text.encode("utf-8") in message.payload


def _int(raw: str | None, name: str) -> int | None:
    if raw is None or not str(raw).strip():
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be a whole number, got {raw!r}.") from None
    if value < 0:
        raise InvalidArgument(f"{name} must be 0 or more.")
    return value


def _time(raw: str | datetime | None, name: str) -> datetime | None:
    if raw is None or isinstance(raw, datetime):
        return raw
    if not raw.strip():
        return None
    value = parse_datetime(raw.strip())
    if value is None:
        raise InvalidArgument(f"{name} must be an ISO 8601 time, got {raw!r}.")
    # a time without an offset is in the server's time zone (as the admin's forms read it)
    return timezone.make_aware(value) if timezone.is_naive(value) else value


# --- reading: keyset pages ------------------------------------------------------------------


def _after(model: type[Queue], key: tuple[Any, ...]) -> Q:
    """Rows whose primary key sorts after ``key`` (in key column order)."""
    names = key_names(model)
    condition = Q(deliver_time__in=[])  # nothing, then OR each
    for i, name in enumerate(names):
        condition |= Q(**dict(zip(names[:i], key[:i], strict=True)), **{f"{name}__gt": key[i]})
    return condition


def batch_size_for(model: type[Queue], requested: int | None = None) -> int:
    """``requested`` (default ``BATCH_SIZE``) capped so a page's re-read stays within 950
    query parameters."""
    return max(1, min(requested or BATCH_SIZE, 950 // len(key_fields(model))))


@dataclass(slots=True)
class Page:
    """Matching messages after ``start``, as read; ``end``: the last key read (None: no more)."""

    messages: list[Message]
    end: tuple[Any, ...] | None


def read_page(
    model: type[Queue], flt: MessageFilter, after: tuple[Any, ...] | None, size: int
) -> Page:
    """The next ``size`` rows matching the database conditions after key ``after``, those
    whose payload also matches; ``end`` is None when no row was left."""
    rows = messages_queryset(model).filter(flt.condition(model, clock.now()))
    if after is not None:
        rows = rows.filter(_after(model, after))
    found = [row_to_message(model, r) for r in rows.order_by(*key_names(model))[:size]]
    if not found:
        return Page([], None)
    return Page([m for m in found if flt.matches_payload(m)], found[-1].key)


def pages(
    model: type[Queue], flt: MessageFilter, size: int, after: tuple[Any, ...] | None = None
) -> Iterator[Page]:
    while True:
        page = read_page(model, flt, after, size)
        if page.end is None:
            return
        yield page
        after = page.end


def count(model: type[Queue], flt: MessageFilter) -> int:
    """How many messages match now (the preview): one count query, or, with a payload text,
    a read of the rows matching the rest, page by page."""
    flt.check(model)
    if not flt.text:
        return messages_queryset(model).filter(flt.condition(model, clock.now())).count()
    return sum(len(p.messages) for p in pages(model, flt, 1000))


# --- acting ---------------------------------------------------------------------------------


@dataclass(slots=True)
class BulkResult:
    """What a run did: ``done`` acted on, ``skipped`` changed or leased since read, in
    ``batches`` transactions; ``cursor`` the last key handled (resume after it); ``finished``
    when no matching message is left after it; ``error`` what stopped it."""

    done: int = 0
    skipped: int = 0
    batches: int = 0
    cursor: tuple[Any, ...] | None = None
    finished: bool = False
    error: str = ""
    log_entries: list[int] = field(default_factory=list)


def _shape(model: type[Queue]) -> tuple[Any, ...]:
    """What a queue's rows must share with another's for a message to move between them: key
    column names and types, payload type, engine."""
    return (
        tuple((f.attname, f.get_internal_type()) for f in key_fields(model)),
        model._meta.get_field("payload").get_internal_type(),
        engine_for(model).alias,
    )


def move_targets(model: type[Queue]) -> list[type[Queue]]:
    """The queues ``model``'s messages can move to: the same key columns (names and types) and
    payload type, on the same engine."""
    shape = _shape(model)
    return [m for m in queue_models() if m is not model and _shape(m) == shape]


def default_move_target(model: type[Queue]) -> type[Queue] | None:
    """A dead-letter queue's source, when it has exactly one (replay)."""
    sources = sources_of(model)
    return sources[0] if len(sources) == 1 else None


def _unchanged(as_read: Message, current: Message | None, now: datetime) -> bool:
    return (
        current is not None
        and current.payload == as_read.payload
        and current.send_time == as_read.send_time
        and current.deliver_time == as_read.deliver_time
        and current.attempt == as_read.attempt
        and current.lease_token == as_read.lease_token
        and not (current.lease_expires_at is not None and current.lease_expires_at > now)
    )


def apply_page(
    model: type[Queue],
    messages: list[Message],
    operation: str,
    *,
    deliver_time: datetime | None = None,
    to: type[Queue] | None = None,
) -> tuple[int, int]:
    """One transaction: act on each of ``messages`` still as read and not leased now; return
    (done, skipped)."""
    engine = engine_for(model)
    db = engine.database
    if not messages:
        return 0, 0

    def run() -> tuple[int, int]:
        now = clock.now()
        condition = Q(*[key_filter(model, m.key) for m in messages], _connector=Q.OR)
        current = {
            m.key: m
            for m in (row_to_message(model, r) for r in messages_queryset(model).filter(condition))
        }
        kept = [m for m in messages if _unchanged(m, current.get(m.key), now)]
        if kept:
            if operation == "delete":
                api.ack_many(model, kept, using=db)
            elif operation == "move":
                api.requeue_many(kept, to=to, using=db)
            else:
                api.requeue_many(kept, deliver_time=deliver_time, using=db)
        return len(kept), len(messages) - len(kept)

    return run_in_transaction(run, using=db, retries=engine.params.transaction_retries)


def check_operation(
    model: type[Queue], operation: str, deliver_time: datetime | None, to: type[Queue] | None
) -> None:
    if operation not in OPERATIONS:
        raise InvalidArgument(f"Unknown operation {operation!r}; one of {', '.join(OPERATIONS)}.")
    if operation == "delay" and deliver_time is None:
        raise InvalidArgument("delay needs a deliver time.")
    if operation == "move" and (to is None or to not in move_targets(model)):
        raise InvalidArgument(
            f"{model._meta.label}'s messages can move only to a queue with the same key columns "
            "and payload type on the same engine: "
            + (", ".join(m._meta.label for m in move_targets(model)) or "there is none")
            + "."
        )


def run_bulk(
    model: type[Queue],
    flt: MessageFilter,
    operation: str,
    *,
    user_id: Any = None,
    deliver_time: datetime | None = None,
    to: type[Queue] | None = None,
    batch_size: int | None = None,
    limit: int | None = None,
    after: tuple[Any, ...] | None = None,
    progress: Callable[[BulkResult], None] | None = None,
) -> BulkResult:
    """Act with ``operation`` (retry, delay, delete, move) on every message of ``model``
    matching ``flt`` after key ``after``, one transaction per page; stop once ``limit``
    messages were read (then ``finished`` is False: run again after ``cursor``). A failing
    batch changes nothing and stops the run (``error``). With ``user_id``, one entry in the
    admin history (``LogEntry``) records the run, its filter and its counts."""
    flt.check(model)
    check_operation(model, operation, deliver_time, to)
    size = batch_size_for(model, batch_size)
    result = BulkResult(cursor=after)
    read = 0
    try:
        while limit is None or read < limit:
            page = read_page(model, flt, result.cursor, min(size, limit - read) if limit else size)
            if page.end is None:
                result.finished = True
                break
            done, skipped = apply_page(
                model, page.messages, operation, deliver_time=deliver_time, to=to
            )
            read += len(page.messages)
            result.done += done
            result.skipped += skipped
            result.batches += 1 if page.messages else 0
            result.cursor = page.end
            if progress is not None:
                progress(result)
    except (DatabaseError, QueueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    if user_id is not None and (result.done or result.skipped or result.error):
        result.log_entries.append(_log(model, flt, operation, result, user_id, deliver_time, to))
    return result


def describe_operation(
    operation: str, deliver_time: datetime | None, to: type[Queue] | None
) -> str:
    if operation == "delay" and deliver_time is not None:
        return f"deliver at {deliver_time.isoformat()}"
    if operation == "move" and to is not None:
        return f"move to {to._meta.label}"
    return OPERATION_LABELS[operation].lower()


def _log(
    model: type[Queue],
    flt: MessageFilter,
    operation: str,
    result: BulkResult,
    user_id: Any,
    deliver_time: datetime | None,
    to: type[Queue] | None,
) -> int:
    db = engine_for(model).database
    content_type = ContentType.objects.db_manager(db).get_for_model(model, for_concrete_model=False)
    what = describe_operation(operation, deliver_time, to)
    text = (
        f"Bulk {what} on {flt.describe()}: {result.done} done, {result.skipped} skipped "
        f"(leased or changed since read), in {result.batches} transaction(s)"
    )
    if result.error:
        text += f"; stopped: {result.error}"
    entry = LogEntry.objects.using(db).create(
        user_id=user_id,
        content_type_id=content_type.pk,
        object_id="",
        object_repr=f"{model._meta.label}: bulk {what}"[:200],
        action_flag=DELETION if operation == "delete" else CHANGE,
        change_message=text + ".",
    )
    return int(entry.pk)


def cursor_token(key: tuple[Any, ...] | None) -> str:
    return "" if key is None else key_token(key)


def parse_cursor(model: type[Queue], token: str) -> tuple[Any, ...] | None:
    if not token:
        return None
    try:
        return parse_key_token(model, token)
    except ValueError as exc:
        raise InvalidArgument(f"Not a key of {model._meta.label}: {exc}") from exc

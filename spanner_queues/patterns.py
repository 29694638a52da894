"""Helpers for the documented Spanner queue patterns. Each is a few lines over ``api``.

- ``resend_later`` / ``checkpoint``: ack a message and send it again under the same key, due
  later (optionally with a new payload), in one transaction (long work, checkpoints, R2/R3).
- ``periodic``: a receiver that runs every ``every`` (or on a ``cron`` expression in a time
  zone) and, in the same transaction, acks its message and sends the next run; ``seed`` sends
  the first run once (R4).
- ``beat`` / ``cancel``: replace the message under a key (heartbeat, R6) or delete it.
- ``window_deliver_time``: a deliver time rounded up to a window, with an optional stable
  per-entity offset (temporal batching).

Inside a receiver run by the worker, ``resend_later``/``checkpoint`` join the receiver's
transaction (when the receiver is ``atomic``) and tell the worker not to ack the message again.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from datetime import timezone as dt_timezone
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter
from django.utils import timezone

from spanner_queues import api, clock
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import InvalidArgument, InvalidMessage, MessageAlreadyExists
from spanner_queues.keys import key_fields
from spanner_queues.message import Message
from spanner_queues.queues import get_queue
from spanner_queues.receivers import ReceiverRegistry, receiver, receivers
from spanner_queues.storage import rows
from spanner_queues.transactions import run_in_transaction

if TYPE_CHECKING:
    from spanner_queues.models import Queue

__all__ = [
    "Cron",
    "Schedule",
    "beat",
    "cancel",
    "checkpoint",
    "next_run",
    "periodic",
    "resend_later",
    "schedules",
    "seed",
    "seed_schedules",
    "window_deliver_time",
]

_SAME: Any = object()


def _db(model: type[Queue], using: str | None) -> str:
    return api._database(model, using)


def _retries(model: type[Queue]) -> int:
    return engine_for(model).params.transaction_retries


def resend_later(
    message: Message,
    *,
    after: timedelta | None = None,
    deliver_time: datetime | None = None,
    payload: Any = _SAME,
    using: str | None = None,
) -> Message:
    """Ack ``message`` and send it again under the same key, due at ``deliver_time`` (or
    ``after`` from now), in one transaction; the payload is kept unless given.

    ``MessageAlreadyAcked`` if the message is gone (then nothing is sent).
    """
    if (after is None) == (deliver_time is None):
        raise InvalidArgument("Pass exactly one of after= or deliver_time=.")
    return api.requeue(
        message,
        deliver_time=deliver_time,
        delay=after,
        payload=message.payload if payload is _SAME else payload,
        using=using,
    )


def checkpoint(
    message: Message, payload: Any, *, after: timedelta, using: str | None = None
) -> Message:
    """Record progress: ack ``message`` and send ``payload`` (the latest state, or a pointer to
    it) under the same key, due ``after`` from now, in one transaction. If the process dies,
    the job resumes from this checkpoint when the new message is delivered."""
    return resend_later(message, after=after, payload=payload, using=using)


# --- heartbeats ------------------------------------------------------------------------------
def beat(
    queue: str | type[Queue],
    key: Mapping[str, Any],
    *,
    timeout: timedelta,
    payload: Any = b"",
    using: str | None = None,
) -> Message:
    """Replace the message under ``key`` with one due ``timeout`` from now (delete + insert in
    one transaction). Call it more often than ``timeout``: the message is delivered (to an
    alerting receiver) only when the beats stop."""
    return api.replace(queue, key, payload=payload, delay=timeout, using=using)


def _whole_key(model: type[Queue], key: Mapping[str, Any]) -> dict[str, Any]:
    """The key's columns; every key field must be given (a default such as a fresh uuid would
    name a different message each time, so ``seed`` would start a new chain on every call and
    ``cancel`` would delete nothing)."""
    missing = [f.name for f in key_fields(model) if f.name not in key and f.attname not in key]
    if missing:
        raise InvalidMessage(
            f"{model._meta.label}: give every key field (missing {', '.join(missing)}); a "
            "schedule or heartbeat needs a stable key."
        )
    return api.build_message(model, dict(key)).key


def cancel(queue: str | type[Queue], key: Mapping[str, Any], *, using: str | None = None) -> int:
    """Delete the message under ``key`` if there is one (a clean shutdown ends its heartbeat);
    returns the number of messages deleted (0 or 1). Runs in the caller's transaction if any."""
    model = get_queue(queue)
    db = _db(model, using)
    columns = _whole_key(model, key)

    def run() -> int:
        return rows(model, db).filter(**columns).delete()[0]

    return run_in_transaction(run, using=db, retries=_retries(model))


# --- temporal batching -----------------------------------------------------------------------
def window_deliver_time(
    window: timedelta,
    *,
    now: datetime | None = None,
    entity: Any = None,
    spread: timedelta | None = None,
) -> datetime:
    """``RoundDown(now, window) + window``: every message sent within one window is due at the
    same instant, so a batch receiver gets them together. With ``entity``, add a stable offset
    in ``[0, spread)`` (default ``spread = window``) derived from it, so that entities spread
    over the window instead of all arriving on the boundary."""
    if window <= timedelta(0):
        raise InvalidArgument("window must be positive.")
    now = now or clock.now()
    step = window.total_seconds()
    epoch = datetime(1970, 1, 1, tzinfo=now.tzinfo or timezone.get_current_timezone())
    elapsed = (now - epoch).total_seconds()
    due = epoch + timedelta(seconds=(elapsed // step) * step) + window
    if entity is not None:
        span = (spread or window).total_seconds()
        fraction = zlib.crc32(str(entity).encode("utf-8")) / 2**32
        due += timedelta(seconds=fraction * span)
    return due


# --- periodic work ---------------------------------------------------------------------------
class Cron:
    """A cron expression (five fields, or croniter's ``@daily``-style aliases) read in a time
    zone. ``next_after(instant)`` is the first run strictly after ``instant``.

    Daylight-saving changes, as Vixie cron does for fixed times: a wall time the clock skips
    (spring forward) runs once, at the instant the clock jumps (every skipped time of one gap
    folds into that single run); a wall time the clock repeats (fall back) runs once, at its
    first occurrence, when it is the schedule's only time in the repeated span (``30 2 * * *``);
    a schedule with several times in it (``*/15 * * * *``) runs at each of them in both passes.

    A random field (croniter's ``R``, ``R(0-4)``) is drawn once per schedule, from ``seed``
    (``periodic`` gives the schedule's queue and key; default: the expression): the same value
    on every run, in every worker, after every restart.
    """

    __slots__ = ("expression", "hash_id", "schedule", "zone")

    def __init__(
        self, expression: str, zone: str | tzinfo | None = None, *, seed: str | None = None
    ) -> None:
        if not isinstance(expression, str) or not croniter.is_valid(expression):
            raise InvalidArgument(f"{expression!r} is not a valid cron expression.")
        if len(expression.split()) > 5:
            raise InvalidArgument(
                f"{expression!r}: give five fields (minute hour day month weekday); "
                "seconds are not supported."
            )
        self.expression = expression
        # R drawn by croniter on each iterator (each run); H is the same draw for a hash_id
        self.schedule = _RANDOM_FIELD.sub("H", expression)
        self.hash_id = (seed if seed is not None else expression).encode()
        try:  # valid to croniter, yet it may match no date at all (30 February)
            self._times(datetime(2000, 1, 1)).get_next(datetime)
        except CroniterBadDateError as exc:
            raise InvalidArgument(f"{expression!r} never runs: it matches no date.") from exc
        self.zone = _zone(zone)

    def __repr__(self) -> str:
        return f"Cron({self.expression!r}, {str(self.zone)!r})"

    def _times(self, start: datetime) -> croniter:
        return croniter(self.schedule, start, hash_id=self.hash_id)

    def next_after(self, instant: datetime) -> datetime:
        """The first run strictly after ``instant`` (an aware datetime), as an aware datetime
        in this schedule's zone."""
        # compare in UTC: aware datetimes sharing a tzinfo compare by wall time, ignoring fold
        after = instant.astimezone(dt_timezone.utc)
        wall = instant.astimezone(self.zone).replace(tzinfo=None)
        times = self._times(wall - timedelta(hours=3))
        best: datetime | None = None
        while True:
            candidates = self._instants(times.get_next(datetime))
            later = [c for c in candidates if c.astimezone(dt_timezone.utc) > after]
            if later:
                first = min(later, key=lambda c: c.astimezone(dt_timezone.utc))
                if best is None or first.astimezone(dt_timezone.utc) < best.astimezone(
                    dt_timezone.utc
                ):
                    best = first
            # a later wall time's instants are at most the fold's shift (< 3 h) earlier
            if best is not None and candidates[0].astimezone(dt_timezone.utc) - timedelta(
                hours=3
            ) > best.astimezone(dt_timezone.utc):
                return best

    def _instants(self, wall: datetime) -> list[datetime]:
        """The instants of a local wall time: where the clock skips it, the end of the gap;
        where the clock repeats it, its first occurrence, and its second too unless it is the
        schedule's only time in the repeated span."""
        first = self._instant(wall)
        second = wall.replace(tzinfo=self.zone, fold=1)
        if second.utcoffset() == first.utcoffset() or self._once_in_repeat(wall):
            return [first]
        return [first, second]

    def _once_in_repeat(self, wall: datetime) -> bool:
        """Whether ``wall``, a repeated wall time, is this schedule's only time in the span the
        clock repeats."""
        start = wall.replace(second=0, microsecond=0)
        while _repeated(start - timedelta(minutes=1), self.zone):
            start -= timedelta(minutes=1)
        times = self._times(start - timedelta(seconds=1))
        count = 0
        while count < 2:
            at = times.get_next(datetime)
            if not _repeated(at, self.zone):
                break
            count += 1
        return count < 2

    def _instant(self, wall: datetime) -> datetime:
        """The instant of a local wall time: its first occurrence when the clock repeats it,
        the end of the gap when the clock skips it."""
        aware = wall.replace(tzinfo=self.zone, fold=0)
        if _exists(aware):
            return aware
        later = wall
        while not _exists(later.replace(tzinfo=self.zone)):
            later += timedelta(minutes=1)
        later = later.replace(second=0, microsecond=0)
        return later.replace(tzinfo=self.zone, fold=0)


#: croniter's random field, ``R`` or ``R(a-b)`` (not the R of a month or day name)
_RANDOM_FIELD = re.compile(r"(?<![A-Za-z])R(?![A-Za-z])")


def _repeated(wall: datetime, zone: tzinfo) -> bool:
    """Whether a local wall time happens twice (the clock falls back over it)."""
    return wall.replace(tzinfo=zone, fold=0).utcoffset() != wall.replace(
        tzinfo=zone, fold=1
    ).utcoffset() and _exists(wall.replace(tzinfo=zone))


def _exists(aware: datetime) -> bool:
    """Whether a local wall time happens (it is not in a spring-forward gap)."""
    utc = aware.astimezone(dt_timezone.utc)
    return utc.astimezone(aware.tzinfo).replace(tzinfo=None) == aware.replace(tzinfo=None)


def _zone(zone: str | tzinfo | None) -> tzinfo:
    if zone is None:
        return timezone.get_default_timezone()
    if isinstance(zone, tzinfo):
        return zone
    try:
        return ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidArgument(f"{zone!r} is not a known time zone.") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """A periodic job: the message under ``key`` in ``queue`` is due every ``every``, or at
    each run of ``cron`` (in its time zone)."""

    queue: str | type[Queue]
    key: Mapping[str, Any]
    every: timedelta | None = None
    cron: Cron | None = None
    payload: Any = b""

    def next_run(self, message: Message | None = None, *, now: datetime | None = None) -> datetime:
        """When the run after ``message`` is due (with no message: the first run; for
        ``every`` that is now). Missed runs are skipped, never caught up."""
        now = now or clock.now()
        if self.cron is not None:
            after = max(now, message.deliver_time) if message and message.deliver_time else now
            return self.cron.next_after(after)
        assert self.every is not None
        if message is None:
            return now
        return next_run(message, self.every, now=now)


def schedules(registry: ReceiverRegistry | None = None) -> list[Schedule]:
    """The schedules registered with ``periodic`` (in the default registry)."""
    return list((registry if registry is not None else receivers).schedules.values())


def next_run(message: Message, every: timedelta, *, now: datetime | None = None) -> datetime:
    """The next due time after ``message``'s: its deliver time plus ``every``, skipping runs
    missed while no worker was up (so a schedule never fires twice to catch up)."""
    now = now or clock.now()
    due = (message.deliver_time or now) + every
    if due <= now:
        missed = (now - due) // every + 1
        due += every * missed
    return due


def seed(
    queue: str | type[Queue],
    key: Mapping[str, Any],
    *,
    payload: Any = b"",
    deliver_time: datetime | None = None,
    using: str | None = None,
) -> Message | None:
    """Send the first message of a schedule unless one already exists under ``key``; safe to
    call from every worker at start (returns None when it was already there)."""
    model = get_queue(queue)
    db = _db(model, using)
    columns = _whole_key(model, key)

    def run() -> Message | None:
        if rows(model, db).filter(**columns).exists():
            return None
        return api.send_many(
            model, [dict(key, payload=payload, deliver_time=deliver_time)], using=db
        )[0]

    try:
        return run_in_transaction(run, using=db, retries=_retries(model))
    except MessageAlreadyExists:
        return None


def seed_schedules(
    queues: list[str] | None = None, *, registry: ReceiverRegistry | None = None
) -> list[Message]:
    """Seed every ``periodic`` schedule of ``registry`` (of ``queues``, if given); what the
    worker runs at start. Returns the messages it sent."""
    sent = []
    for schedule in schedules(registry):
        label = get_queue(schedule.queue)._meta.label
        if queues is not None and label not in queues:
            continue
        first = schedule.next_run() if schedule.cron is not None else None
        message = seed(schedule.queue, schedule.key, payload=schedule.payload, deliver_time=first)
        if message is not None:
            sent.append(message)
    return sent


def periodic(
    queue: str | type[Queue],
    *,
    key: Mapping[str, Any],
    every: timedelta | None = None,
    cron: str | None = None,
    timezone: str | tzinfo | None = None,
    payload: Any = b"",
    atomic: bool = True,
    registry: ReceiverRegistry | None = None,
) -> Callable[[Callable[[Message], Any]], Callable[[Message], Any]]:
    """Register a receiver for the message under ``key`` that runs the function, then acks the
    message and sends the next run, in one transaction when ``atomic``. The next run is due
    ``every`` after this one, or at the next run of the ``cron`` expression read in
    ``timezone`` (a zone name such as ``"Europe/Paris"``; default ``settings.TIME_ZONE``);
    see ``Cron`` for daylight-saving changes. Give exactly one of ``every`` and ``cron``. The
    worker seeds the first run at start (``seed_schedules``): at once for ``every``, at the
    next cron time for ``cron``.

    Several schedules can share a queue: each receiver matches its own ``key``.
    """
    if (every is None) == (cron is None):
        raise InvalidArgument("Pass exactly one of every= or cron=.")
    if every is not None and every <= timedelta(0):
        raise InvalidArgument("every must be positive.")
    if timezone is not None and cron is None:
        raise InvalidArgument("timezone= goes with cron=.")
    identity = (str(queue), repr(sorted(dict(key).items())))
    schedule = Schedule(
        queue=queue,
        key=dict(key),
        every=every,
        cron=Cron(cron, timezone, seed=repr(identity)) if cron is not None else None,
        payload=payload,
    )

    def decorator(func: Callable[[Message], Any]) -> Callable[[Message], Any]:
        def run_periodic(message: Message) -> None:
            func(message)
            resend_later(message, deliver_time=schedule.next_run(message))

        run_periodic.__module__ = func.__module__
        run_periodic.__qualname__ = f"{func.__qualname__}[periodic]"
        receiver(queue, atomic=atomic, match=dict(key), registry=registry)(run_periodic)
        (registry if registry is not None else receivers).schedules[identity] = schedule
        return func

    return decorator

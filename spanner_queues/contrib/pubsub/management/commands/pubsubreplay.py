"""``manage.py pubsubreplay``: publish archived events of a relayed queue (``RelayedEvent``)
again to its topic, chosen by time range, key or event id, with a ``replay_id`` attribute; an
inbox takes them in again only if it accepts that replay (``pubsubacceptreplay``)."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from datetime import datetime, time
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from spanner_queues.contrib.pubsub.models import RelayedEvent
from spanner_queues.contrib.pubsub.replay import (
    REPLAY_BATCH,
    ReplayFailed,
    new_replay_id,
    replay,
    topic_of,
)
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import QueueError
from spanner_queues.queues import get_queue


def moment(text: str) -> datetime:
    """An ISO date or date-time (naive: in the current time zone)."""
    value = parse_datetime(text)
    if value is None:
        day = parse_date(text)
        if day is None:
            raise CommandError(f"not an ISO date or date-time: {text!r}")
        value = datetime.combine(day, time())
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return value


def key_texts(value: str) -> set[str]:
    """The ``key`` attribute texts ``value`` may mean: a JSON array as it is, else the one-field
    key of the value as text and, when it reads as JSON (a number), as that value."""
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if isinstance(parsed, list):
        return {json.dumps(parsed, default=str, separators=(",", ":"))}
    texts = {json.dumps([value], separators=(",", ":"))}
    if parsed is not None and not isinstance(parsed, (dict, list)):
        texts.add(json.dumps([parsed], separators=(",", ":")))
    return texts


class Command(BaseCommand):
    help = (
        "Publish archived events of a relayed queue again to its topic (the archive keeps "
        "SPANNER_QUEUES_PUBSUB['ARCHIVE_DAYS'] days), with their event ids, keys and ordering "
        "keys and a replay_id attribute. Choose them by --since/--until, --key, "
        "--ordering-key or --event-id (all given must match). "
        "An inbox drops them as duplicates unless it accepts the replay id "
        "(manage.py pubsubacceptreplay)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("queue", help="The relayed queue (app_label.Model).")
        parser.add_argument(
            "--since", type=moment, help="Events published at or after (ISO date or date-time)."
        )
        parser.add_argument("--until", type=moment, help="Events published before.")
        parser.add_argument(
            "--key",
            action="append",
            default=[],
            help="Events of this message key (a value, or a JSON array of a compound key's "
            "values); repeatable.",
        )
        parser.add_argument(
            "--ordering-key",
            action="append",
            default=[],
            help="Events of this Pub/Sub ordering key (the ordering fields' values joined by "
            "'/'); repeatable.",
        )
        parser.add_argument(
            "--event-id", action="append", default=[], help="This event id; repeatable."
        )
        parser.add_argument(
            "--replay-id",
            help="The replay's id (the replay_id attribute; default: a new one, printed).",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=REPLAY_BATCH,
            help="Events published and confirmed at a time (default: %(default)s).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Print how many events match; publish none."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            model = get_queue(options["queue"])
            topic = topic_of(model._meta.label)
        except QueueError as exc:
            raise CommandError(str(exc)) from exc
        chosen = ("since", "until", "key", "ordering_key", "event_id")
        if not any(options[c] for c in chosen):
            raise CommandError(
                "choose the events: --since, --until, --key, --ordering-key or --event-id"
            )
        if not 1 <= options["batch_size"] <= 1000:
            raise CommandError("--batch-size must be from 1 to 1000")
        events = self.events(model._meta.label, engine_for(model).database, options)
        count = events.count()
        if options["dry_run"]:
            self.stdout.write(
                f"dry run: {count} event(s) of {model._meta.label} would be replayed to {topic}"
            )
            return
        replay_id = options["replay_id"] or new_replay_id()
        if len(replay_id) > 100:
            raise CommandError("--replay-id is longer than 100 characters")
        self.stdout.write(f"replay {replay_id}: {count} event(s) of {model._meta.label} to {topic}")
        try:
            done = replay(
                events,
                replay_id,
                batch_size=options["batch_size"],
                progress=lambda n: self.stdout.write(f"replay {replay_id}: {n}/{count} published"),
            )
        except ReplayFailed as exc:
            raise CommandError(f"replay {replay_id} stopped: {exc}") from exc
        self.stdout.write(f"replay {replay_id}: done, {done} event(s) published")

    def events(self, queue: str, database: str, options: dict[str, Any]) -> QuerySet[RelayedEvent]:
        events = RelayedEvent.objects.using(database).filter(queue=queue)
        if options["since"]:
            events = events.filter(published_at__gte=options["since"])
        if options["until"]:
            events = events.filter(published_at__lt=options["until"])
        if options["key"]:
            events = events.filter(key__in={t for k in options["key"] for t in key_texts(k)})
        if options["ordering_key"]:
            events = events.filter(ordering_key__in=options["ordering_key"])
        if options["event_id"]:
            events = events.filter(event_id__in=options["event_id"])
        return events

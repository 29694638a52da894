"""``manage.py pubsubacceptreplay``: let an inbox take in a replay (``pubsubreplay``) again."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from spanner_queues import clock
from spanner_queues.contrib.pubsub.models import AcceptedReplay, accepted_replay_id
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import QueueError
from spanner_queues.options import queue_options
from spanner_queues.queues import get_queue


class Command(BaseCommand):
    help = (
        "Let an inbox queue take in the events of a replay (pubsubreplay --replay-id) again: "
        "each replayed event is taken in once more, and once only; without this, replayed "
        "events it took in before are dropped as duplicates. Run it before the replay."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("inbox", help="The inbox queue (app_label.Model).")
        parser.add_argument("replay_id", help="The replay's id.")
        parser.add_argument(
            "--revoke", action="store_true", help="Take the replay's events as duplicates again."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            model = get_queue(options["inbox"])
        except QueueError as exc:
            raise CommandError(str(exc)) from exc
        if queue_options(model).pubsub_subscription is None:
            raise CommandError(f"{model._meta.label} is not an inbox (no pubsub_subscription)")
        label, replay_id = model._meta.label, options["replay_id"]
        if not 0 < len(replay_id) <= 100:
            raise CommandError("a replay id has 1 to 100 characters")
        rows = AcceptedReplay.objects.using(engine_for(model).database)
        pk = accepted_replay_id(label, replay_id)
        if options["revoke"]:
            rows.filter(pk=pk).delete()
            self.stdout.write(f"{label} takes replay {replay_id} as duplicates")
            return
        rows.get_or_create(
            pk=pk, defaults={"inbox": label, "replay_id": replay_id, "accepted_at": clock.now()}
        )
        self.stdout.write(f"{label} takes in replay {replay_id} once")

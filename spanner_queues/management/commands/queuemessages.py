"""``manage.py queuemessages QUEUE [filter] [--retry | --delay TIME | --delete | --move-to QUEUE]``.

Counts the messages of a queue matching a filter (the admin's, ``admin.bulk.MessageFilter``)
and, with an action, acts on all of them in bounded transactions (``admin.bulk.run_bulk``),
printing a progress line per batch. ``--dry-run`` only counts. A message leased, acked or
replaced between its read and its batch's transaction is skipped and counted.
"""

from __future__ import annotations

from argparse import ArgumentParser
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from spanner_queues.admin.bulk import (
    FILTER_STATES,
    BulkResult,
    MessageFilter,
    check_operation,
    count,
    default_move_target,
    describe_operation,
    run_bulk,
)
from spanner_queues.exceptions import QueueError
from spanner_queues.queues import get_queue


def _pairs(values: list[str], option: str) -> dict[str, str]:
    found = {}
    for value in values:
        name, sep, text = value.partition("=")
        if not sep or not name:
            raise CommandError(f"{option} takes COLUMN=VALUE, got {value!r}.")
        found[name] = text
    return found


class Command(BaseCommand):
    help = (
        "Count a queue's messages matching a filter; with --retry, --delay, --delete or "
        "--move-to, act on all of them in bounded transactions."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("queue", metavar="QUEUE", help="Queue label or name.")
        find = parser.add_argument_group("filter (every given condition holds)")
        find.add_argument("--key", action="append", default=[], metavar="COLUMN=VALUE")
        find.add_argument(
            "--prefix", action="append", default=[], metavar="COLUMN=TEXT", help="Text keys."
        )
        find.add_argument("--text", default="", help="Payload substring (at most 200 chars).")
        find.add_argument("--min-attempts", default="")
        find.add_argument("--max-attempts", default="")
        find.add_argument("--after", default="", help="Due at or after (ISO 8601, with offset).")
        find.add_argument("--before", default="", help="Due before (ISO 8601, with offset).")
        find.add_argument("--state", default="", choices=("", *FILTER_STATES))
        act = parser.add_mutually_exclusive_group()
        act.add_argument("--retry", action="store_true", help="Deliver now (ack + send again).")
        act.add_argument("--delay", metavar="TIME", help="Deliver at TIME (ISO 8601).")
        act.add_argument("--delete", action="store_true", help="Ack (delete).")
        act.add_argument(
            "--move-to",
            nargs="?",
            const="",
            metavar="QUEUE",
            help="Move to QUEUE (default: a dead-letter queue's source).",
        )
        parser.add_argument("--dry-run", action="store_true", help="Only count.")
        parser.add_argument("--batch-size", type=int, default=None)
        parser.add_argument("--user", default="", help="Record the run in the admin history.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._handle(options)
        except (QueueError, DatabaseError) as exc:
            raise CommandError(str(exc)) from exc

    def _handle(self, options: dict[str, Any]) -> None:
        model = get_queue(options["queue"])
        params = {f"key.{k}": v for k, v in _pairs(options["key"], "--key").items()}
        params |= {f"prefix.{k}": v for k, v in _pairs(options["prefix"], "--prefix").items()}
        for name in ("text", "min_attempts", "max_attempts", "after", "before", "state"):
            params[name] = options[name]
        flt = MessageFilter.from_params(model, params)
        operation, when, to = self._operation(model, options)
        label = model._meta.label
        matching = count(model, flt)
        self.stdout.write(f"{label}: {matching} message(s) match {flt.describe()}.")
        if operation is None:
            return
        check_operation(model, operation, when, to)
        what = describe_operation(operation, when, to)
        if options["dry_run"]:
            self.stdout.write(f"Dry run: would {what} {matching} message(s).")
            return
        user_id = self._user_id(options["user"])

        def progress(result: BulkResult) -> None:
            self.stdout.write(
                f"batch {result.batches}: {result.done} done, {result.skipped} skipped"
            )

        result = run_bulk(
            model,
            flt,
            operation,
            user_id=user_id,
            deliver_time=when,
            to=to,
            batch_size=options["batch_size"],
            progress=progress,
        )
        summary = (
            f"{what}: {result.done} done, {result.skipped} skipped (leased or changed since "
            f"read), in {result.batches} transaction(s)."
        )
        if result.error:
            raise CommandError(f"Stopped: {result.error}. So far: {summary}")
        self.stdout.write(summary)

    def _operation(
        self, model: Any, options: dict[str, Any]
    ) -> tuple[str | None, datetime | None, Any]:
        if options["retry"]:
            return "retry", None, None
        if options["delete"]:
            return "delete", None, None
        if options["delay"]:
            when = MessageFilter.from_params(model, {"after": options["delay"]}).deliver_after
            return "delay", when, None
        if options["move_to"] is not None:
            to = get_queue(options["move_to"]) if options["move_to"] else None
            to = to or default_move_target(model)
            if to is None:
                raise CommandError(f"--move-to needs a queue: {model._meta.label} has no source.")
            return "move", None, to
        return None, None, None

    def _user_id(self, username: str) -> Any:
        if not username:
            return None
        users = get_user_model()
        user = users._default_manager.filter(**{users.USERNAME_FIELD: username}).first()
        if user is None:
            raise CommandError(f"No user {username!r}.")
        return user.pk

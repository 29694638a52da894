"""``manage.py queuegrants --role-sender ROLE --role-worker ROLE``: print the fine-grained access
control grants a sender role (web processes) and a worker role (``runqueueworker``) need for the
declared queues, in the GoogleSQL or PostgreSQL dialect of Spanner.

Guarantees: it only prints (nothing is run, the database is not read); the statements are
Google's documented spelling (docs/howto/cloud-spanner.md#fine-grained-access-control):

- a native queue: the sender gets ``INSERT ON QUEUE``; the worker gets ``SELECT, INSERT,
  DELETE ON QUEUE`` (ack is a delete; a retry, dead letter or give-back sends again; the gauges
  and the summary read the queue) and ``EXECUTE`` on ``RECEIVE_<Q>`` and ``RENEWLEASE_<Q>``;
- a table-engine queue: the sender gets ``INSERT ON TABLE``; the worker ``SELECT, INSERT,
  UPDATE, DELETE ON TABLE`` (claims and renewals update rows);
- the app's own tables: the failure ledger when a queue's engine counts no deliveries, the depth
  samples, the paused queues (workers read them, the admin writes them), the rate-limit buckets
  when a queue has ``rate_limit``, and (with ``spanner_queues.contrib.tasks`` installed) the
  task results when a queue of a ``QueueBackend`` (``TaskMessage`` or one of its
  ``QUEUE_MODELS``) is among the queues (the worker may delete them when a backend sets
  ``RESULT_RETENTION_SECONDS``).

Your receivers' own tables are not known here: grant them to the worker role yourself.
"""

from __future__ import annotations

import re
from argparse import ArgumentParser, ArgumentTypeError
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError

from spanner_queues import options as queue_settings
from spanner_queues.controls import PausedQueue, QueueRate
from spanner_queues.engines import engine_for, spanner_sql
from spanner_queues.exceptions import QueueError
from spanner_queues.failures import FailedDelivery
from spanner_queues.monitoring import QueueDepthSample
from spanner_queues.queues import get_queue, queue_models
from spanner_queues.uniqueness import SentKey

if TYPE_CHECKING:
    from spanner_queues.models import Queue

GOOGLESQL = "googlesql"
POSTGRESQL = "postgresql"

#: a database role name (Spanner: letters, digits and underscores, starting with a letter)
_ROLE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,127}$")

QUEUE_SENDER = ("INSERT",)
QUEUE_WORKER = ("SELECT", "INSERT", "DELETE")
TABLE_SENDER = ("INSERT",)
TABLE_WORKER = ("SELECT", "INSERT", "UPDATE", "DELETE")


def role_name(value: str) -> str:
    if not _ROLE.match(value):
        raise ArgumentTypeError(
            f"{value!r} is not a database role name (a letter, then letters, digits or _)"
        )
    return value


@dataclass(frozen=True, slots=True)
class Grant:
    """One privilege list on one object for one role."""

    privileges: tuple[str, ...]
    kind: str  # "QUEUE", "TABLE" or "FUNCTION" (a queue's table-valued function)
    name: str
    role: str

    def render(self, dialect: Any, dialect_name: str) -> str:
        to = f"TO ROLE {self.role}" if dialect_name == GOOGLESQL else f"TO {self.role}"
        privileges = ", ".join(self.privileges)
        if self.kind == "FUNCTION":
            on = (
                f"ON TABLE FUNCTION {self.name}"
                if dialect_name == GOOGLESQL
                else f"ON FUNCTION {self.name}"
            )
        else:
            on = f"ON {self.kind} {dialect.quote(self.name)}"
        return f"GRANT {privileges} {on} {to};"


class Command(BaseCommand):
    help = (
        "Print the fine-grained access control grants (GRANT ... TO ROLE) that a sender role "
        "(web processes) and a worker role (runqueueworker) need for the declared queues, in "
        "the GoogleSQL or PostgreSQL dialect. Prints only; run the output with gcloud or in "
        "Spanner Studio."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--role-sender", type=role_name, required=True, help="The web processes' role."
        )
        parser.add_argument(
            "--role-worker", type=role_name, required=True, help="The workers' role."
        )
        parser.add_argument(
            "--dialect",
            choices=[GOOGLESQL, POSTGRESQL],
            default=None,
            help="Spelling of the grants (default: each native engine's DIALECT, else googlesql).",
        )
        parser.add_argument(
            "--queue",
            action="append",
            default=[],
            metavar="QUEUE",
            help="Only this queue (label or table name; repeat it). Default: every declared "
            "queue. A queue's dead-letter queue gets the worker's INSERT too.",
        )
        parser.add_argument(
            "--create-roles",
            action="store_true",
            help="Start with CREATE ROLE for both roles.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        sender: str = options["role_sender"]
        worker: str = options["role_worker"]
        if sender == worker:
            raise CommandError("--role-sender and --role-worker must be two roles.")
        try:
            models = [get_queue(q) for q in options["queue"]] or queue_models()
        except QueueError as exc:
            raise CommandError(str(exc)) from exc
        if not models:
            raise CommandError("No queue is declared.")
        chosen: str = options["dialect"] or _default_dialect(models)
        dialect = spanner_sql(chosen)
        lines: list[str] = [
            f"-- spanner_queues: fine-grained access control for {len(models)} queue(s), "
            f"{'GoogleSQL' if chosen == GOOGLESQL else 'PostgreSQL'} dialect",
            f"-- sender role {sender} (web processes), worker role {worker} (runqueueworker)",
        ]
        if options["create_roles"]:
            lines += [f"CREATE ROLE {sender};", f"CREATE ROLE {worker};"]
        selected = {m._meta.db_table for m in models}
        for model in models:
            for grant in _queue_grants(model, dialect, sender, worker, selected):
                lines.append(grant if isinstance(grant, str) else grant.render(dialect, chosen))
        lines.append("-- spanner_queues' own tables")
        lines += [g.render(dialect, chosen) for g in _own_grants(models, sender, worker)]
        lines.append(f"-- and the tables your receivers write, to {worker}")
        self.stdout.write("\n".join(lines))


def _default_dialect(models: list[type[Queue]]) -> str:
    """The native engines' ``DIALECT`` when they all agree, else GoogleSQL."""
    names = {
        dialect.name
        for m in models
        if (dialect := getattr(engine_for(m), "dialect", None)) is not None
    }
    return names.pop() if len(names) == 1 else GOOGLESQL


def _queue_grants(
    model: type[Queue], dialect: Any, sender: str, worker: str, selected: set[str]
) -> list[Grant | str]:
    """A queue's grants, each after its comment line: the queue (or its table) and its
    functions, and the worker's INSERT on its dead-letter queue when that is not among the
    ``selected`` tables."""
    table = model._meta.db_table
    out: list[Grant | str] = []
    if engine_for(model).features.supports_native_queues:
        out += [
            f"-- {model._meta.label}: native queue {table}",
            Grant(QUEUE_SENDER, "QUEUE", table, sender),
            Grant(QUEUE_WORKER, "QUEUE", table, worker),
            Grant(("EXECUTE",), "FUNCTION", dialect.receive_function(table), worker),
            Grant(("EXECUTE",), "FUNCTION", dialect.renew_function(table), worker),
        ]
    else:
        out += [
            f"-- {model._meta.label}: table-engine queue {table}",
            Grant(TABLE_SENDER, "TABLE", table, sender),
            Grant(TABLE_WORKER, "TABLE", table, worker),
        ]
    dead = queue_settings.queue_options(model).dead_letter_queue
    if dead:
        target = get_queue(dead)
        if target._meta.db_table not in selected:
            kind = "QUEUE" if engine_for(target).features.supports_native_queues else "TABLE"
            out += [
                f"-- {model._meta.label} dead-letters into {target._meta.label}",
                Grant(("INSERT",), kind, target._meta.db_table, worker),
            ]
    return out


def _own_grants(models: list[type[Queue]], sender: str, worker: str) -> list[Grant]:
    """The app's own tables ``models``' workers and senders use."""
    own: list[Grant] = []
    if any(not engine_for(m).features.supports_attempt_count for m in models):
        own.append(Grant(TABLE_WORKER, "TABLE", FailedDelivery._meta.db_table, worker))
    own.append(
        Grant(("SELECT", "INSERT", "DELETE"), "TABLE", QueueDepthSample._meta.db_table, worker)
    )
    paused = PausedQueue._meta.db_table  # workers read it; the admin (web) pauses
    own.append(Grant(("SELECT",), "TABLE", paused, worker))
    own.append(Grant(("SELECT", "INSERT", "DELETE"), "TABLE", paused, sender))
    # sends with unique_for (any sender, a receiver's send in the worker): claims and prunes
    sent_keys = SentKey._meta.db_table
    own.append(Grant(("SELECT", "INSERT", "UPDATE", "DELETE"), "TABLE", sent_keys, sender))
    own.append(Grant(("SELECT", "INSERT", "UPDATE", "DELETE"), "TABLE", sent_keys, worker))
    if any(queue_settings.queue_options(m).rate_limit for m in models):  # the shared buckets
        own.append(Grant(("SELECT", "INSERT", "UPDATE"), "TABLE", QueueRate._meta.db_table, worker))
    return own + _task_result_grants(models, sender, worker)


def _task_result_grants(models: list[type[Queue]], sender: str, worker: str) -> list[Grant]:
    """The task results table, when the tasks app is installed and a queue of a
    ``QueueBackend`` is among ``models``."""
    if not apps.is_installed("spanner_queues.contrib.tasks"):
        return []
    # the optional tasks app: its modules import its models, importable only when it is
    # installed
    from spanner_queues.contrib.tasks.runner import queue_backends

    # Django's Tasks API on spanner_queues: the results table, for the backend's default
    # queue and the queues of QUEUE_MODELS alike (their workers write results)
    task_queues = {apps.get_model("spanner_queues_tasks", "TaskMessage")}
    for backend in queue_backends():
        task_queues.update(backend.all_queue_models(declared_only=True))
    if not task_queues.intersection(models):
        return []
    results = apps.get_model("spanner_queues_tasks", "TaskResultRecord")._meta.db_table
    # the worker inserts a task's row when it finishes (native queues: when it starts, then
    # updates it) and deletes old ones (RESULT_RETENTION_SECONDS); the web process reads them
    # (get_result) and may prune them too
    return [
        Grant(("SELECT", "INSERT", "UPDATE", "DELETE"), "TABLE", results, worker),
        Grant(("SELECT", "DELETE"), "TABLE", results, sender),
    ]

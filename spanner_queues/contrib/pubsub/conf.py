"""The ``SPANNER_QUEUES_PUBSUB`` setting, parsed into a frozen ``PubSubParams``; Pub/Sub paths
of the queues' topics and subscriptions; the app's system checks (E301, E302, W301)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core import checks

from spanner_queues.drivers import driver_for
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import InvalidQueueEngine, QueueConfigurationError
from spanner_queues.keys import key_fields
from spanner_queues.options import QueueOptions, queue_options
from spanner_queues.queues import queue_models

if TYPE_CHECKING:
    from django.db import models

    from spanner_queues.models import Queue


class PubSubUnavailable(QueueConfigurationError):
    """The Pub/Sub app is installed (or its modules imported) but google-cloud-pubsub is not."""


PUBSUB_KEYS = frozenset(
    {
        "PROJECT",
        "DEDUP_WINDOW_DAYS",
        "ARCHIVE_DAYS",
        "RELAY_BATCH_SIZE",
        "PUBLISH_TIMEOUT_SECONDS",
        "PULL_MAX_MESSAGES",
        "PULL_WAIT_SECONDS",
    }
)
#: Pub/Sub's longest message retention: a copy can come back this long after the first
DEFAULT_WINDOW_DAYS = 7
#: the row deletion policy the app's migration (0001) gives ``SeenEvent`` on Spanner: its rows
#: expire this many days after ``seen_at``, whatever ``DEDUP_WINDOW_DAYS`` says (W301)
POLICY_DAYS = 7
#: Pub/Sub's limits (https://cloud.google.com/pubsub/quotas#resource_limits)
MAX_PULL_MESSAGES = 1000
MAX_ORDERING_KEY_BYTES = 1024
#: a topic or subscription id (https://cloud.google.com/pubsub/docs/pubsub-basics#resource_names):
#: 3 to 255 characters, a letter first, then letters, digits and ``-_.~+%``; never "goog..."
RESOURCE_ID = re.compile(r"[A-Za-z][A-Za-z0-9\-_.~+%]{2,254}")
#: a full path: ``projects/<project>/topics/<id>`` or ``.../subscriptions/<id>``
RESOURCE_PATH = re.compile(r"projects/[^/]+/(topics|subscriptions)/([^/]+)")


@dataclass(frozen=True, slots=True, kw_only=True)
class PubSubParams:
    """The ``SPANNER_QUEUES_PUBSUB`` setting."""

    #: the Google Cloud project of topic and subscription ids (None: ``GOOGLE_CLOUD_PROJECT``)
    project: str | None = None
    #: days an inbox remembers the event ids it took in (duplicates within it are dropped)
    dedup_window_days: int = DEFAULT_WINDOW_DAYS
    #: days the relay keeps each published event in its archive (``RelayedEvent``), for
    #: replays; 0 keeps none
    archive_days: int = DEFAULT_WINDOW_DAYS
    #: most messages of a relayed queue one publish round takes (the relay's batch)
    relay_batch_size: int = 500
    #: seconds the relay waits for Pub/Sub to confirm a publish before it gives the message back
    publish_timeout: float = 60.0
    #: most Pub/Sub messages one pull of an inbox takes (one transaction)
    pull_max_messages: int = 100
    #: seconds one pull waits for messages (a stop waits at most this long for the puller)
    pull_wait: float = 2.0


def parse_pubsub(raw: Any) -> PubSubParams:
    """Validate ``SPANNER_QUEUES_PUBSUB``; ``InvalidQueueEngine`` with the reason."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise InvalidQueueEngine("SPANNER_QUEUES_PUBSUB must be a dict.")
    unknown = set(raw) - PUBSUB_KEYS
    if unknown:
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES_PUBSUB has unknown keys: {', '.join(sorted(unknown))}. "
            f"Known: {', '.join(sorted(PUBSUB_KEYS))}."
        )
    project = raw.get("PROJECT")
    if project is not None and (not isinstance(project, str) or not project):
        raise InvalidQueueEngine("SPANNER_QUEUES_PUBSUB['PROJECT'] must be a project id.")

    def number(key: str, default: float, low: float, high: float, kind: type) -> Any:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise InvalidQueueEngine(
                f"SPANNER_QUEUES_PUBSUB[{key!r}] must be a number, not {value!r}."
            )
        if not low <= value <= high:
            raise InvalidQueueEngine(
                f"SPANNER_QUEUES_PUBSUB[{key!r}] must be from {low:g} to {high:g}, not {value!r}."
            )
        return kind(value)

    return PubSubParams(
        project=project,
        dedup_window_days=number("DEDUP_WINDOW_DAYS", DEFAULT_WINDOW_DAYS, 1, 3650, int),
        archive_days=number("ARCHIVE_DAYS", DEFAULT_WINDOW_DAYS, 0, 3650, int),
        relay_batch_size=number("RELAY_BATCH_SIZE", 500, 1, 1000, int),
        publish_timeout=number("PUBLISH_TIMEOUT_SECONDS", 60.0, 0.1, 3600, float),
        pull_max_messages=number("PULL_MAX_MESSAGES", 100, 1, MAX_PULL_MESSAGES, int),
        pull_wait=number("PULL_WAIT_SECONDS", 2.0, 0.1, 60, float),
    )


def pubsub_params() -> PubSubParams:
    """``SPANNER_QUEUES_PUBSUB`` as it is now (read on each call: tests override it)."""
    return parse_pubsub(getattr(settings, "SPANNER_QUEUES_PUBSUB", None))


def project_id(params: PubSubParams | None = None) -> str | None:
    """The project of topic and subscription ids: ``PROJECT``, else ``GOOGLE_CLOUD_PROJECT``."""
    params = params or pubsub_params()
    return params.project or os.environ.get("GOOGLE_CLOUD_PROJECT") or None


def resource_path(kind: str, name: str, params: PubSubParams | None = None) -> str:
    """``projects/P/topics/T`` (``kind`` "topics") or ``projects/P/subscriptions/S``: ``name``
    as it is when it is a full path, else in the configured project."""
    if name.startswith("projects/"):
        return name
    project = project_id(params)
    if project is None:
        raise QueueConfigurationError(
            f"Pub/Sub {kind[:-1]} {name!r} is not a full path and no project is configured: "
            "set SPANNER_QUEUES_PUBSUB = {'PROJECT': ...} or GOOGLE_CLOUD_PROJECT."
        )
    return f"projects/{project}/{kind}/{name}"


def relayed_queues() -> list[type[Queue]]:
    """The declared queues with ``QueueMeta.pubsub_topic``."""
    return [m for m in queue_models() if queue_options(m).pubsub_topic is not None]


def inbox_queues() -> list[type[Queue]]:
    """The declared queues with ``QueueMeta.pubsub_subscription``."""
    return [m for m in queue_models() if queue_options(m).pubsub_subscription is not None]


def ordering_fields(model: type[models.Model]) -> tuple[str, ...]:
    """The key field names whose values make a relayed message's ordering key: as declared
    (``pubsub_ordering_key``), else the queue's ``ordered_by`` fields, else every key field but
    the last."""
    options = queue_options(model)
    declared = options.pubsub_ordering_key
    fields = key_fields(model)
    names = tuple(f.name for f in fields)
    if declared is None and options.ordered_by:
        return tuple(
            next(f.name for f in fields if n in (f.name, f.attname)) for n in options.ordered_by
        )
    if declared is None:
        return names[:-1] if len(names) > 1 else ()
    return tuple(declared)


def check_setting(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E301: ``SPANNER_QUEUES_PUBSUB`` is invalid."""
    try:
        pubsub_params()
    except QueueConfigurationError as exc:
        return [
            checks.Error(
                str(exc),
                hint='For example {"PROJECT": "my-project", "DEDUP_WINDOW_DAYS": 7}. See '
                "docs/howto/pubsub.md.",
                id="spanner_queues.E301",
            )
        ]
    return []


def check_queues(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E302: a relayed queue or an inbox declared so that the app cannot run it."""
    try:
        params = pubsub_params()
    except QueueConfigurationError:
        return []  # E301's
    problems: list[checks.CheckMessage] = []
    for model in queue_models():
        options = queue_options(model)
        for text, hint in (
            _resource_problems(options, params)
            + _relay_problems(model, options)
            + _inbox_problems(model, options)
        ):
            problems.append(checks.Error(text, hint=hint, obj=model, id="spanner_queues.E302"))
    return problems


#: a problem of a queue's declaration: the error's text and its hint
_Problem = tuple[str, str]


def _resource_problems(options: QueueOptions, params: PubSubParams) -> list[_Problem]:
    """``pubsub_topic`` and ``pubsub_subscription``, where declared, are ids or paths of
    resources in the configured project."""
    problems: list[_Problem] = []
    topic, subscription = options.pubsub_topic, options.pubsub_subscription
    for name, value in (("pubsub_topic", topic), ("pubsub_subscription", subscription)):
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            problems.append((f"QueueMeta.{name} must be a non-empty string.", "An id or a path."))
            continue
        kind = "topics" if name == "pubsub_topic" else "subscriptions"
        wrong = resource_name_problem(kind, value)
        if wrong is not None:
            problems.append((f"QueueMeta.{name} {value!r}: {wrong}", RESOURCE_HINT))
            continue
        try:
            resource_path(kind, value, params)
        except QueueConfigurationError as exc:
            problems.append((str(exc), "See docs/howto/pubsub.md."))
    return problems


RESOURCE_HINT = (
    "Pub/Sub's resource names: https://cloud.google.com/pubsub/docs/pubsub-basics"
    "#resource_names (Pub/Sub refuses every publish or pull of a malformed one)."
)


def resource_name_problem(kind: str, value: str) -> str | None:
    """What is wrong with ``value`` as the id or full path of a Pub/Sub resource of ``kind``
    ("topics" or "subscriptions") by Pub/Sub's naming rules; None when nothing is."""
    resource_id = value
    if value.startswith("projects/"):
        match = RESOURCE_PATH.fullmatch(value)
        if match is None or match.group(1) != kind:
            return f"a full path is projects/<project>/{kind}/<id>."
        resource_id = match.group(2)
    if not RESOURCE_ID.fullmatch(resource_id):
        return (
            f"a {kind[:-1]} id is 3 to 255 characters, starts with a letter and has only "
            "letters, digits and - _ . ~ + %."
        )
    if resource_id.lower().startswith("goog"):
        return f"a {kind[:-1]} id may not start with 'goog'."
    return None


def _relay_problems(model: type[models.Model], options: QueueOptions) -> list[_Problem]:
    """A relayed queue is not also an inbox, has a dead-letter queue and, if it declares an
    ordering key, a tuple of its key fields; a queue that is not relayed declares none."""
    problems: list[_Problem] = []
    topic = options.pubsub_topic
    if topic is not None and options.pubsub_subscription is not None:
        problems.append(
            (
                "A queue is either relayed (pubsub_topic) or an inbox (pubsub_subscription).",
                "Declare two queues.",
            )
        )
    if topic is not None and not options.dead_letter_queue:
        problems.append(
            (
                "A relayed queue needs a dead_letter_queue: a message Pub/Sub refuses (too "
                "large, bad attributes) is moved there rather than retried for ever.",
                "Declare QueueMeta.dead_letter_queue (same key fields).",
            )
        )
    declared = options.pubsub_ordering_key
    if topic is None:
        if declared is not None:
            problems.append(("pubsub_ordering_key needs pubsub_topic.", "Remove it."))
        return problems
    names = {f.name for f in key_fields(model)}
    if declared is not None and (
        isinstance(declared, str)
        or not isinstance(declared, (tuple, list))
        or not set(declared) <= names
    ):
        problems.append(
            (
                f"QueueMeta.pubsub_ordering_key must be a tuple of key field names "
                f"({', '.join(sorted(names))}), not {declared!r}.",
                "() publishes without ordering keys.",
            )
        )
    return problems


def inbox_key(model: type[models.Model]) -> tuple[Any, Any]:
    """The key fields of an inbox queue: the one holding each message's Pub/Sub ordering key
    (an ordered inbox's first key field, its ``ordered_by``; None for an unordered inbox) and
    the one holding its event id (the last). Checked by ``_inbox_problems`` (E302)."""
    fields = key_fields(model)
    ordering = fields[0] if len(fields) == 2 and queue_options(model).ordered_by else None
    return ordering, fields[-1]


def _inbox_problems(model: type[models.Model], options: QueueOptions) -> list[_Problem]:
    """An inbox queue has one character key field (the event id), or, ordered (``ordered_by``
    its first), two: the ordering key and the event id; and no envelope."""
    if options.pubsub_subscription is None:
        return []
    problems: list[_Problem] = []
    fields = key_fields(model)
    chars = all(f.get_internal_type() in ("CharField", "TextField") for f in fields)
    if options.ordered_by:
        if len(fields) != 2 or not chars:
            problems.append(
                (
                    "An ordered inbox queue (pubsub_subscription and ordered_by) needs two key "
                    "fields, CharFields: the Pub/Sub ordering key (its ordered_by), then the "
                    "event id.",
                    "e.g. ordering_key = models.CharField(max_length=1024); event_id = "
                    "models.CharField(max_length=128); pk = models.CompositePrimaryKey("
                    '"ordering_key", "event_id"); QueueMeta.ordered_by = ("ordering_key",)',
                )
            )
    elif len(fields) != 1 or not chars:
        problems.append(
            (
                "An inbox queue (pubsub_subscription) needs exactly one key field, a "
                "CharField: each message is keyed by its event id (or, ordered per Pub/Sub "
                "ordering key, two: see ordered_by).",
                "e.g. event_id = models.CharField(max_length=128, primary_key=True)",
            )
        )
    if options.envelope is not None:
        problems.append(
            (
                "An inbox queue stores each Pub/Sub message's data as it came (an envelope "
                "queue's relay publishes its whole CloudEvent); QueueMeta.envelope would "
                "wrap it a second time.",
                "Remove QueueMeta.envelope from the inbox queue.",
            )
        )
    return problems


def check_dedup_window(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W301: ``DEDUP_WINDOW_DAYS`` is longer than the row deletion policy that expires the
    ``SeenEvent`` rows on the Spanner database of an inbox queue: there the window is
    ``POLICY_DAYS`` unless the policy was lengthened. (The policy is schema, written once by
    the migration; a setting read at ``migrate`` would not follow later changes of it.)"""
    try:
        days = pubsub_params().dedup_window_days
    except QueueConfigurationError:
        return []  # E301's
    if days <= POLICY_DAYS:
        return []
    table = apps.get_model("spanner_queues_pubsub", "SeenEvent")._meta.db_table
    problems: list[checks.CheckMessage] = []
    for model in inbox_queues():
        try:
            database = engine_for(model).database
        except QueueConfigurationError:
            continue  # the core's E001/E002
        if database not in settings.DATABASES:
            continue  # the core's E006
        if not driver_for(database).supports_row_deletion_policy:
            continue  # no policy there: the pullers prune to the window
        problems.append(
            checks.Warning(
                f"SPANNER_QUEUES_PUBSUB['DEDUP_WINDOW_DAYS'] = {days}, but on Spanner (database "
                f"{database!r}) the row deletion policy of {table} deletes the seen ids "
                f"{POLICY_DAYS} days after they were taken in: a copy older than {POLICY_DAYS} "
                "days is taken in again.",
                hint=f"Set DEDUP_WINDOW_DAYS to {POLICY_DAYS} or less, or lengthen the policy "
                f"in a migration of your own (RunSQL on that database: ALTER TABLE {table} "
                f"REPLACE ROW DELETION POLICY (OLDER_THAN(seen_at, INTERVAL {days} DAY))) and "
                "silence spanner_queues.W301. See docs/howto/pubsub.md.",
                obj=model,
                id="spanner_queues.W301",
            )
        )
    return problems


def check_archive_window(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W302: ``ARCHIVE_DAYS`` is longer than the row deletion policy that expires the
    ``RelayedEvent`` rows (migration 0002, ``POLICY_DAYS``) on the Spanner database of a
    relayed queue: there the archive keeps ``POLICY_DAYS`` unless the policy was lengthened."""
    try:
        days = pubsub_params().archive_days
    except QueueConfigurationError:
        return []  # E301's
    if days <= POLICY_DAYS:
        return []
    table = apps.get_model("spanner_queues_pubsub", "RelayedEvent")._meta.db_table
    problems: list[checks.CheckMessage] = []
    for model in relayed_queues():
        try:
            database = engine_for(model).database
        except QueueConfigurationError:
            continue  # the core's E001/E002
        if (
            database not in settings.DATABASES
            or not driver_for(database).supports_row_deletion_policy
        ):
            continue  # the core's E006; or no policy there: the relay prunes to the window
        problems.append(
            checks.Warning(
                f"SPANNER_QUEUES_PUBSUB['ARCHIVE_DAYS'] = {days}, but on Spanner (database "
                f"{database!r}) the row deletion policy of {table} deletes archived events "
                f"{POLICY_DAYS} days after they were published: older ones cannot be replayed.",
                hint=f"Set ARCHIVE_DAYS to {POLICY_DAYS} or less, or lengthen the policy in a "
                f"migration of your own (RunSQL on that database: ALTER TABLE {table} REPLACE "
                f"ROW DELETION POLICY (OLDER_THAN(published_at, INTERVAL {days} DAY))) and "
                "silence spanner_queues.W302. See docs/howto/pubsub.md.",
                obj=model,
                id="spanner_queues.W302",
            )
        )
    return problems

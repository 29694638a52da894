"""System checks (``spanner_queues.E0xx`` errors, ``W0xx`` warnings).

E001 SPANNER_QUEUES is invalid            E002 a queue names an unknown engine alias
E003 SQLite without IMMEDIATE transactions E004 interleave_in_parent is not a usable key field
E005 unknown QueueMeta attribute          E006 an engine's DATABASE is not in DATABASES
E007 the engine cannot run on its database (e.g. native queues on SQLite or the emulator)
E008 max_attempts without a dead-letter queue or discard_after_max_attempts; bad dead_letter_queue
E009 USE_TZ is False (deliver times, leases and back-off are aware datetimes)
E010 a queue's field name clashes with a column or method Queue needs (a key field named
     lease_token, payload, deliver_time...; a field named send, delay, using...)
E011 payload, deliver_time or a bookkeeping field redeclared with another type
E012 payload_type is not "bytes", "string" or "json", or disagrees with the payload field
E013 row_deletion_policy is not {"older_than": <deliver_time or a DateTimeField key>, "days": n}
E014 a Spanner database or the native engine is configured, but the Spanner driver (the
     `spanner` extra: django-google-spanner, google-cloud-spanner) is not installed
E020 concurrency_limit is not a positive int, or rate_limit not a positive number
E021 ordered_by is not a proper prefix of the queue's key fields

E104 TASKS names spanner_queues' QueueBackend but spanner_queues.contrib.tasks is not installed
     (E101-E103, the backend's own, are reported by the app when it is installed)
E203 SPANNER_QUEUES_METRICS is set but spanner_queues.contrib.metrics is not installed
     (E201, the setting's own, is reported by the app when it is installed)
E303 a queue declares pubsub_topic or pubsub_subscription, or SPANNER_QUEUES_PUBSUB is set, but
     spanner_queues.contrib.pubsub is not installed (E301, E302: the app's own)
W001 SQLite without WAL                   W002 django_spanner is not first in INSTALLED_APPS
W003 a queue's schema options (engine, interleave_in_parent, native_options,
     row_deletion_policy) differ from its migrations: there is no AlterQueue, so the change
     needs a migration written by hand
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.migrations.loader import MigrationLoader
from django.db.models import ForeignKey
from django.utils.module_loading import import_string

from spanner_queues import queues
from spanner_queues.autodetector import SCHEMA_OPTIONS, declared_schema_options
from spanner_queues.conf import ENGINE_SHORTCUTS, NATIVE_ENGINE
from spanner_queues.drivers import SPANNER_BACKEND, SPANNER_EXTRA, missing_spanner_packages
from spanner_queues.engines import engines
from spanner_queues.exceptions import QueueConfigurationError, QueueError
from spanner_queues.keys import key_fields, key_names
from spanner_queues.operations import CreateQueue, DeleteQueue
from spanner_queues.options import (
    KNOWN_OPTIONS,
    MAX_RATE_LIMIT,
    MIN_RATE_LIMIT,
    ordered_by_problems,
    queue_options,
    row_deletion,
    unknown_options,
)
from spanner_queues.payload import (
    BYTES,
    JSON,
    PAYLOAD_TYPES,
    STRING,
    field_payload_type,
    payload_type,
)


@checks.register(checks.Tags.models, checks.Tags.database)
def check_queues(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:

    problems: list[checks.CheckMessage] = []
    _e014, unloadable_databases, unloadable_engines = _check_spanner_packages()  # reported below
    usable: dict[str, Any] = {}
    for alias in engines.settings:
        if alias in unloadable_engines:
            continue
        try:
            engine = engines[alias]
        except QueueConfigurationError as exc:
            problems.append(checks.Error(str(exc), id="spanner_queues.E001"))
            continue
        if engine.database not in settings.DATABASES:
            problems.append(
                checks.Error(
                    f"SPANNER_QUEUES[{alias!r}]['DATABASE'] = {engine.database!r} is not in "
                    "DATABASES.",
                    id="spanner_queues.E006",
                )
            )
            continue
        usable[alias] = engine
    for engine in usable.values():
        if engine.database not in unloadable_databases:
            problems.extend(engine.check())

    if not settings.USE_TZ:
        problems.append(
            checks.Error(
                "spanner_queues needs USE_TZ = True.",
                hint="Deliver times, leases and back-off are compared as aware UTC datetimes.",
                id="spanner_queues.E009",
            )
        )

    installed = list(settings.INSTALLED_APPS)
    spanner_dbs = [a for a, d in settings.DATABASES.items() if d.get("ENGINE") == "django_spanner"]
    if spanner_dbs and installed and installed[0] != "django_spanner":
        problems.append(
            checks.Warning(
                "django_spanner is not the first entry of INSTALLED_APPS.",
                hint="Put 'django_spanner' first: otherwise models built before it is imported "
                "(such as admin's LogEntry) fail to insert on Spanner.",
                id="spanner_queues.W002",
            )
        )

    recorded = _recorded_schema_options()
    for model in queues.queue_models():
        if app_configs is not None and model._meta.app_config not in app_configs:
            continue
        problems.extend(_check_queue_model(model, usable, engines.settings))
        problems.extend(_check_schema_options(model, recorded))
    return problems


@checks.register(checks.Tags.models)
def check_spanner_packages(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E014, reported here rather than by ``check_queues``, which leaves out the aliases the
    driver is missing for; it reads settings and opens no database. (Both run under a plain
    ``manage.py check`` and ``runserver``: Django 5.2 and 6.0 run a ``database``-tagged check
    there too, with ``databases=None``; ``tests/test_checks_without_database.py``.)"""
    return _check_spanner_packages()[0]


def _check_spanner_packages() -> tuple[list[checks.CheckMessage], set[str], set[str]]:
    """E014: the problems, and the DATABASES and SPANNER_QUEUES aliases that cannot load
    without the Spanner driver. A project on no Spanner database looks for nothing."""
    databases = {
        alias for alias, db in settings.DATABASES.items() if db.get("ENGINE") == SPANNER_BACKEND
    }
    native = set()
    for alias, raw in engines.settings.items():
        engine = raw.get("ENGINE") if isinstance(raw, dict) else None
        if isinstance(engine, str) and ENGINE_SHORTCUTS.get(engine, engine) == NATIVE_ENGINE:
            native.add(alias)
    problems: list[checks.CheckMessage] = []
    if not (databases or native):
        return problems, set(), set()
    hint = f"pip install '{SPANNER_EXTRA}' (django-google-spanner and google-cloud-spanner)."
    missing = missing_spanner_packages(native=False)
    if missing:
        for alias in sorted(databases):
            problems.append(
                checks.Error(
                    f"DATABASES[{alias!r}]['ENGINE'] = {SPANNER_BACKEND!r}, but "
                    f"{_not_installed(missing)}.",
                    hint=hint,
                    id="spanner_queues.E014",
                )
            )
    else:
        databases = set()
    missing = missing_spanner_packages(native=True) if native else []
    if missing:
        for alias in sorted(native):
            problems.append(
                checks.Error(
                    f"SPANNER_QUEUES[{alias!r}] uses the native engine (Spanner queues), but "
                    f"{_not_installed(missing)}.",
                    hint=hint,
                    id="spanner_queues.E014",
                )
            )
    else:
        native = set()
    return problems, databases, native


def unloadable_spanner_databases() -> str | None:
    """E014's message when a database is on Spanner (``django_spanner``) without the driver;
    raised by the app before any model is built: Django's own model checks open every
    database's backend, and would stop at "isn't an available database backend" first."""
    aliases = [a for a, db in settings.DATABASES.items() if db.get("ENGINE") == SPANNER_BACKEND]
    missing = missing_spanner_packages(native=False) if aliases else []
    if not missing:
        return None
    return (
        f"DATABASES[{aliases[0]!r}]['ENGINE'] = {SPANNER_BACKEND!r}, but "
        f"{_not_installed(missing)}: pip install '{SPANNER_EXTRA}'."
    )


def _not_installed(distributions: list[str]) -> str:
    verb = "is" if len(distributions) == 1 else "are"
    return f"{' and '.join(distributions)} {verb} not installed"


def _recorded_schema_options() -> dict[tuple[str, str], dict[str, Any]]:
    """The ``queue_options`` of the last ``CreateQueue`` of each queue, in migration order."""

    try:
        loader = MigrationLoader(None, ignore_no_migrations=True)
    except Exception:  # broken migration files are reported by Django itself
        return {}
    recorded: dict[tuple[str, str], dict[str, Any]] = {}
    plan: list[tuple[str, str]] = []
    for leaf in loader.graph.leaf_nodes():
        plan.extend(n for n in loader.graph.forwards_plan(leaf) if n not in plan)
    for node in plan:
        for op in loader.graph.nodes[node].operations:
            key = (node[0], op.name_lower) if hasattr(op, "name_lower") else None
            if isinstance(op, CreateQueue):
                recorded[key] = dict(op.queue_options)  # type: ignore[index]
            elif isinstance(op, DeleteQueue):
                recorded.pop(key, None)  # type: ignore[arg-type]
    return recorded


def _check_schema_options(
    model: Any, recorded: dict[tuple[str, str], dict[str, Any]]
) -> list[checks.CheckMessage]:

    key = (model._meta.app_label, model._meta.model_name)
    if key not in recorded:
        return []  # not migrated yet: makemigrations writes CreateQueue with the options
    declared = declared_schema_options(model)
    before = {k: v for k, v in recorded[key].items() if k in SCHEMA_OPTIONS}
    if declared == before:
        return []
    return [
        checks.Warning(
            f"QueueMeta schema options {declared!r} differ from the migrations' {before!r}.",
            hint="Spanner cannot alter a queue's engine, parent or options in place and there "
            "is no AlterQueue operation: write a migration that drops and recreates the queue "
            "(DeleteQueue + CreateQueue, moving its messages), or revert the change.",
            obj=model,
            id="spanner_queues.W003",
        )
    ]


def _check_dead_letter(model: Any, options: Any) -> list[checks.CheckMessage]:

    problems: list[checks.CheckMessage] = []
    if options.max_attempts is not None and (
        not isinstance(options.max_attempts, int) or options.max_attempts < 1
    ):
        problems.append(
            checks.Error(
                "QueueMeta.max_attempts must be a positive int.",
                obj=model,
                id="spanner_queues.E008",
            )
        )
    if options.dead_letter_queue:
        try:
            target = queues.get_queue(options.dead_letter_queue)
        except QueueError as exc:
            problems.append(checks.Error(str(exc), obj=model, id="spanner_queues.E008"))
        else:
            if key_names(target) != key_names(model):
                problems.append(
                    checks.Error(
                        f"Dead-letter queue {target._meta.label} must have the same key fields "
                        f"as {model._meta.label}: {key_names(model)}.",
                        obj=model,
                        id="spanner_queues.E008",
                    )
                )
            problems.extend(_check_dead_letter_payloads(model, target))
    elif options.max_attempts and not options.discard_after_max_attempts:
        problems.append(
            checks.Error(
                "QueueMeta.max_attempts is set but there is no dead_letter_queue.",
                hint="Name a dead_letter_queue, or set discard_after_max_attempts = True to "
                "drop such messages.",
                obj=model,
                id="spanner_queues.E008",
            )
        )
    return problems


def _check_dead_letter_payloads(model: Any, target: Any) -> list[checks.CheckMessage]:
    """A dead-lettered message keeps its payload bytes: the dead-letter queue must take them
    (the same payload type, bytes for any, or string for canonical JSON text)."""

    if _payload_type_problem(model, None) or _payload_type_problem(target, None):
        return []  # reported as E012
    source, dead = payload_type(model), payload_type(target)
    if source == dead or dead == BYTES or (source, dead) == (JSON, STRING):
        return []
    return [
        checks.Error(
            f"Dead-letter queue {target._meta.label} ({dead} payloads) cannot take the "
            f"payloads of {model._meta.label} ({source}).",
            hint="Give the dead-letter queue the same payload_type, or bytes.",
            obj=model,
            id="spanner_queues.E008",
        )
    ]


def _payload_type_problem(model: Any, declared: str | None) -> str | None:
    """Why the queue's payload type is unusable, or None."""

    if declared is not None and declared not in PAYLOAD_TYPES:
        return f"QueueMeta.payload_type = {declared!r} is not 'bytes', 'string' or 'json'."
    try:
        field = model._meta.get_field("payload")
        stored = field_payload_type(field)
    except FieldDoesNotExist:
        return "A queue model needs its payload field."
    except QueueConfigurationError as exc:
        return str(exc)
    if declared is not None and declared != stored:
        return (
            f"QueueMeta.payload_type = {declared!r}, but the model declares its payload field "
            f"as a {type(field).__name__} ({stored})."
        )
    return None


def _check_payload_type(model: Any, options: Any) -> list[checks.CheckMessage]:
    problem = _payload_type_problem(model, options.payload_type)
    if problem is None:
        return []
    return [
        checks.Error(
            problem,
            hint="Declare QueueMeta.payload_type and leave the payload field to the Queue base.",
            obj=model,
            id="spanner_queues.E012",
        )
    ]


#: the columns every queue has, and the field types they must keep
QUEUE_COLUMNS: dict[str, tuple[type[models.Field], ...]] = {
    "payload": (models.BinaryField, models.TextField),  # bytes; string or JSON text
    "deliver_time": (models.DateTimeField,),
    "send_time": (models.DateTimeField,),
    "attempts": (models.IntegerField,),
    "lease_token": (models.CharField,),
    "lease_expires_at": (models.DateTimeField,),
}
#: names a field of a queue cannot have: the keyword arguments of ``send``/``replace`` (a key
#: field named so could never be given) and the classmethods a field would hide
RESERVED_FIELD_NAMES = frozenset(
    {"delay", "using", "key", "send", "send_many", "replace", "as_message", "objects"}
)


def _check_fields(model: Any) -> list[checks.CheckMessage]:
    """E010/E011: names and types that pass makemigrations and migrate but break at run time."""
    problems: list[checks.CheckMessage] = []
    for field in key_fields(model):
        if field.name in QUEUE_COLUMNS or field.attname in QUEUE_COLUMNS:
            problems.append(
                checks.Error(
                    f"Key field {field.name!r} of {model._meta.label} is one of the columns "
                    "every queue has (and the engine rewrites or reads as such).",
                    hint=f"Rename the key field; reserved: {', '.join(sorted(QUEUE_COLUMNS))}.",
                    obj=model,
                    id="spanner_queues.E010",
                )
            )
    for field in model._meta.get_fields():
        name = getattr(field, "name", "")
        if name in RESERVED_FIELD_NAMES or getattr(field, "attname", None) in RESERVED_FIELD_NAMES:
            problems.append(
                checks.Error(
                    f"Field {name!r} of {model._meta.label} clashes with an argument or method "
                    "of Queue (send, send_many, replace take delay=, using=, payload=...).",
                    hint=f"Rename the field; reserved: {', '.join(sorted(RESERVED_FIELD_NAMES))}.",
                    obj=model,
                    id="spanner_queues.E010",
                )
            )
    for name, types in QUEUE_COLUMNS.items():
        try:
            field = model._meta.get_field(name)
        except Exception:
            field = None
        if field is None or not isinstance(field, types) or field.primary_key:
            declared = type(field).__name__ if field is not None else "nothing"
            problems.append(
                checks.Error(
                    f"{model._meta.label}.{name} must be a "
                    f"{' or '.join(t.__name__ for t in types)} (as Queue declares it), not "
                    f"{declared}.",
                    hint=f"Do not redeclare {name!r} in a queue model.",
                    obj=model,
                    id="spanner_queues.E011",
                )
            )
    return problems


def _check_limits(model: Any, options: Any) -> list[checks.CheckMessage]:
    problems: list[checks.CheckMessage] = []
    limit = options.concurrency_limit
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        problems.append(
            checks.Error(
                f"QueueMeta.concurrency_limit must be a positive int, not {limit!r}.",
                obj=model,
                id="spanner_queues.E020",
            )
        )
    rate = options.rate_limit
    if rate is not None and (
        isinstance(rate, bool)
        or not isinstance(rate, (int, float))
        or not MIN_RATE_LIMIT <= rate < MAX_RATE_LIMIT
    ):
        problems.append(
            checks.Error(
                f"QueueMeta.rate_limit must be a positive number of messages per second, at "
                f"least one a day (1/86400) and below 1,000,000, not {rate!r}.",
                obj=model,
                id="spanner_queues.E020",
            )
        )
    return problems


def _check_queue_model(model: Any, usable: dict[str, Any], configured: Any) -> list[Any]:
    problems: list[checks.CheckMessage] = _check_fields(model)
    problems += _check_limits(model, queue_options(model))
    for name in unknown_options(model):
        problems.append(
            checks.Error(
                f"QueueMeta.{name} is not a queue option.",
                hint=f"Known options: {', '.join(sorted(KNOWN_OPTIONS))}.",
                obj=model,
                id="spanner_queues.E005",
            )
        )
    options = queue_options(model)
    if options.engine not in configured:
        problems.append(
            checks.Error(
                f"QueueMeta.engine = {options.engine!r} is not an alias in SPANNER_QUEUES.",
                obj=model,
                id="spanner_queues.E002",
            )
        )
    problems.extend(_check_dead_letter(model, options))
    problems.extend(
        checks.Error(
            text,
            hint="Name the key fields whose equal values make one ordering key, e.g. "
            "ordered_by = ('customer',) for a key (customer, message_id).",
            obj=model,
            id="spanner_queues.E021",
        )
        for text in ordered_by_problems(model)
    )
    try:
        row_deletion(model, options)
    except QueueConfigurationError as exc:
        problems.append(checks.Error(str(exc), obj=model, id="spanner_queues.E013"))
    problems.extend(_check_payload_type(model, options))
    parent = options.interleave_in_parent
    if parent:
        keys = key_fields(model)
        field = next((f for f in keys if f.name == parent), None)
        if field is None or not isinstance(field, ForeignKey) or keys[0] is not field:
            problems.append(
                checks.Error(
                    f"QueueMeta.interleave_in_parent = {parent!r} must name a ForeignKey that "
                    "is the first field of the primary key.",
                    obj=model,
                    id="spanner_queues.E004",
                )
            )
        elif field.column != field.related_model._meta.pk.column:
            problems.append(
                checks.Error(
                    f"The interleaved key column {field.column!r} must have the parent's "
                    f"primary-key column name {field.related_model._meta.pk.column!r} "
                    "(Spanner requires it).",
                    hint=f"Declare the ForeignKey with db_column="
                    f"{field.related_model._meta.pk.column!r}.",
                    obj=model,
                    id="spanner_queues.E004",
                )
            )
    return problems


#: the optional app of Django's Tasks backend (this module never imports it)
TASKS_APP = "spanner_queues.contrib.tasks"


def _is_queue_backend(path: Any) -> bool:
    """Whether the ``BACKEND`` path names the Tasks app's ``QueueBackend`` or a subclass.
    A path that does not import is left to django-tasks' own checks."""
    if not isinstance(path, str):
        return False
    try:
        backend = import_string(path)
    except ImportError:
        return path.startswith(TASKS_APP + ".")  # e.g. django-tasks is not installed
    return isinstance(backend, type) and any(
        (c.__module__, c.__name__) == (TASKS_APP + ".backend", "QueueBackend")
        for c in backend.__mro__
    )


@checks.register()
def check_tasks_app(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E104: a ``TASKS`` backend is spanner_queues' ``QueueBackend`` but its app (its queue,
    results table and task receiver) is not in ``INSTALLED_APPS``."""
    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict) or apps.is_installed(TASKS_APP):
        return []
    return [
        checks.Error(
            f"TASKS[{alias!r}] uses spanner_queues' QueueBackend, but {TASKS_APP!r} is not in "
            "INSTALLED_APPS.",
            hint=f'Add "{TASKS_APP}" to INSTALLED_APPS (on Django 5.2 "django_tasks" too, the '
            "backport) and run `manage.py migrate spanner_queues_tasks` (the task queue and "
            "results). See docs/howto/tasks.md.",
            id="spanner_queues.E104",
        )
        for alias, conf in configured.items()
        if isinstance(conf, dict) and _is_queue_backend(conf.get("BACKEND"))
    ]


#: the optional metrics app (this module never imports it)
METRICS_APP = "spanner_queues.contrib.metrics"


@checks.register()
def check_metrics_app(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E203: ``SPANNER_QUEUES_METRICS`` is set but the metrics app, which reads it, is not in
    ``INSTALLED_APPS`` (its own checks, E201, run only when it is)."""
    if not hasattr(settings, "SPANNER_QUEUES_METRICS") or apps.is_installed(METRICS_APP):
        return []
    return [
        checks.Error(
            f"SPANNER_QUEUES_METRICS is set, but {METRICS_APP!r} is not in INSTALLED_APPS: "
            "nothing reads it.",
            hint=f'Add "{METRICS_APP}" to INSTALLED_APPS (and pip install '
            "'spanner-queues[metrics]'), or remove the setting. See docs/howto/metrics.md.",
            id="spanner_queues.E203",
        )
    ]


#: the optional Pub/Sub app (this module never imports it)
PUBSUB_APP = "spanner_queues.contrib.pubsub"


@checks.register()
def check_pubsub_app(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E303: a queue declares ``pubsub_topic`` or ``pubsub_subscription`` (or
    ``SPANNER_QUEUES_PUBSUB`` is set) but the Pub/Sub app, which relays and pulls them, is not in
    ``INSTALLED_APPS``: nothing would publish or pull (its own checks, E301-E302, run only when
    it is)."""
    if apps.is_installed(PUBSUB_APP):
        return []
    hint = (
        f"Add \"{PUBSUB_APP}\" to INSTALLED_APPS (and pip install 'spanner-queues[pubsub]'). "
        "See docs/howto/pubsub.md."
    )
    problems: list[checks.CheckMessage] = []
    if hasattr(settings, "SPANNER_QUEUES_PUBSUB"):
        problems.append(
            checks.Error(
                f"SPANNER_QUEUES_PUBSUB is set, but {PUBSUB_APP!r} is not in INSTALLED_APPS.",
                hint=hint,
                id="spanner_queues.E303",
            )
        )
    for model in queues.queue_models():
        options = queue_options(model)
        for name in ("pubsub_topic", "pubsub_subscription"):
            if getattr(options, name) is not None:
                problems.append(
                    checks.Error(
                        f"QueueMeta.{name} is set, but {PUBSUB_APP!r} is not in INSTALLED_APPS: "
                        "nothing relays or pulls this queue.",
                        hint=hint,
                        obj=model,
                        id="spanner_queues.E303",
                    )
                )
    return problems

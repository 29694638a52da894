"""``QueueBackend``: a Tasks backend whose ``enqueue()`` is a queue send in the caller's
transaction.

Guarantees:

- ``enqueue()`` writes one row: the task's message (path, arguments, options), on the
  queue's database, on the caller's connection: inside the caller's ``atomic()`` block it
  commits or rolls back with the caller's writes (no ``on_commit``); outside one it commits
  at once. The worker writes the result row when the task finishes, with the ack.
- ``run_after`` is the message's deliver time: no worker receives it before then.
- ``get_result()`` reads the result row, else the message (``RUNNING`` while leased, else
  ``READY``); ``TaskResultDoesNotExist`` if there is neither.
- Priority is refused (``supports_priority = False``) on every engine: native queues cannot
  order by one, and one honoured on some engines only would be ignored silently on others.
- ``@task(max_attempts=..., retry_delay=..., timeout=...)``: this backend's task options
  (``QueueTask``); unknown ones raise ``InvalidTask``.

``OPTIONS``:

- ``"QUEUES"`` (top level, Django's own): allowed ``queue_name`` values (default
  ``["default"]``; ``[]`` allows any).
- ``"OPTIONS": {"QUEUE_MODELS": {"emails": "shop.EmailTasks"}}``: the queue model of a
  ``queue_name`` (default: ``spanner_queues_tasks.TaskMessage``). Such a model has one ``CharField``
  primary key of at least 64 characters and ``QueueMeta.payload_type = "json"``, and no
  receiver of its own (the backend registers one).
- ``"OPTIONS": {"ATOMIC_TASKS": False}``: run each task outside any transaction (for long
  tasks, or tasks calling other systems: on SQLite an open write transaction holds the
  database's single write lock); default ``True``, the task's writes commit with its success.
- ``"OPTIONS": {"RESULT_RETENTION_SECONDS": 604800}``: finished results older than this are
  deleted by ``prune_results()`` (the task receiver calls it at most once a minute per
  process). ``None`` (the default) keeps them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from django.apps import apps
from django.core import checks
from django.db import transaction
from django.utils.module_loading import import_string

from spanner_queues import api, clock, uniqueness
from spanner_queues.contrib.tasks.framework import (
    FRAMEWORK_APP,
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    get_random_id,
    task_enqueued,
)
from spanner_queues.contrib.tasks.models import (
    FINISHED,
    READY,
    RUNNING,
    UNKNOWN_WORKER,
    TaskResultRecord,
    dumps,
)
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import QueueConfigurationError, QueueError
from spanner_queues.keys import row_to_message
from spanner_queues.payload import JSON, payload_type
from spanner_queues.queues import get_queue
from spanner_queues.storage import rows
from spanner_queues.transactions import run_in_transaction
from spanner_queues.uniqueness import key_text

T = TypeVar("T")
P = ParamSpec("P")

#: the app of this backend (its queue, results and task receiver)
APP = "spanner_queues.contrib.tasks"
#: a result id of release 0.1.0: the framework's 32 random characters, no queue named in it
LEGACY_RESULT_ID = re.compile(r"[A-Za-z0-9]{32}")
DEFAULT_QUEUE_MODEL = "spanner_queues_tasks.TaskMessage"
#: the keys of a ``QueueBackend``'s ``OPTIONS``
OPTIONS = frozenset({"QUEUE_MODELS", "ATOMIC_TASKS", "RESULT_RETENTION_SECONDS"})

__all__ = [
    "TASK_OPTIONS",
    "QueueBackend",
    "QueueTask",
    "missing_task",
    "payload_of",
    "record_from_payload",
    "result_from_record",
    "task_of",
    "task_options",
    "was_dropped",
]


#: this backend's options of ``@task(...)`` (and their defaults): Django 6.1 and the backport
#: hand ``@task``'s extra keywords to the backend's ``task_class``
TASK_OPTIONS = {"max_attempts": 1, "retry_delay": 0.0, "timeout": None}


class _RefusesUnknownOptions(type):
    """``QueueTask(...)`` with an option this backend does not have: the framework's
    ``InvalidTask`` naming it and the known ones (not the dataclass's bare ``TypeError``)."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise InvalidTask(
                f"@task() got {', '.join(map(repr, unknown))}, which "
                "spanner_queues.contrib.tasks.QueueBackend does not know; its options are "
                f"{', '.join([*TASK_OPTIONS, 'unique_for'])} (docs/howto/tasks.md, "
                "'Task options')."
            )
        return super().__call__(*args, **kwargs)


@dataclasses.dataclass(frozen=True, kw_only=True)
class QueueTask(Task, metaclass=_RefusesUnknownOptions):
    """A task of ``QueueBackend`` (its ``task_class``): Django's ``Task`` with this backend's
    options, given to ``@task(...)`` (Django 6.1, the django-tasks backport; Django 6.0 refuses
    them) and checked by ``validate_task``:

    - ``max_attempts`` (default 1: Django's semantics, a failed task is not run again): runs in
      all; a run that raises (or passes its ``timeout``) before the last records its error in
      ``result.errors`` and the task goes back to ``READY``, due after ``retry_delay``.
    - ``retry_delay``: seconds (or a ``timedelta``) between a failed run and the next.
    - ``timeout``: this task's time limit in seconds, instead of the worker's ``--timeout``.
    - ``unique_for``: a positive ``timedelta``: enqueue the task with the same arguments at most
      once per window (``api.send_many``'s ``unique_for``, keyed by the task's path and
      arguments). A dropped ``enqueue()`` writes nothing, sends no ``task_enqueued`` and
      returns a result with ``enqueued_at=None`` (``was_dropped(result)``).
    """

    max_attempts: int = 1
    retry_delay: float | timedelta = 0.0
    timeout: float | None = None
    unique_for: timedelta | None = None


def was_dropped(result: TaskResult) -> bool:
    """Whether ``enqueue()`` dropped the task (``unique_for``: enqueued within its window)."""
    return result.enqueued_at is None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def task_options(task: Task) -> dict[str, Any]:
    """The options of ``task`` that differ from their defaults, as its message stores them
    (``retry_delay`` in seconds); ``{}`` for a task of another backend's class."""
    out: dict[str, Any] = {}
    for name, default in TASK_OPTIONS.items():
        value = getattr(task, name, default)
        if isinstance(value, timedelta):
            value = value.total_seconds()
        if value != default:
            out[name] = value
    return out


class QueueBackend(BaseTaskBackend):
    """Tasks on spanner_queues: transactional enqueue, runs on ``runqueueworker``."""

    task_class = QueueTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = False  # queues deliver by deliver time; no engine orders by priority

    def __init__(self, alias: str, params: dict) -> None:
        """Never raises on wrong ``OPTIONS`` (it runs in ``AppConfig.ready()``): ``check()``
        reports them (E102, E103) and the wrong values are left out here."""
        super().__init__(alias, params)
        options: dict[str, Any] = self.options if isinstance(self.options, dict) else {}  # E103
        models = options.get("QUEUE_MODELS", {})
        self.queue_models: dict[str, str] = (
            {k: v for k, v in models.items() if isinstance(v, str)}
            if isinstance(models, dict)
            else {}
        )
        #: whether a task runs in the transaction that records its success and acks it
        self.atomic_tasks = options.get("ATOMIC_TASKS", True) is not False
        retention: Any = options.get("RESULT_RETENTION_SECONDS")
        self.result_retention = (
            timedelta(seconds=retention) if _is_positive_number(retention) else None
        )

    def validate_task(self, task: Task) -> None:
        """The framework's checks, and this backend's options (``InvalidTask`` if wrong)."""
        super().validate_task(task)
        attempts = getattr(task, "max_attempts", 1)
        if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
            raise InvalidTask(f"max_attempts must be a whole number >= 1, not {attempts!r}.")
        delay = getattr(task, "retry_delay", 0.0)
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if not _is_number(seconds) or not 0 <= seconds < float("inf"):
            raise InvalidTask(f"retry_delay must be seconds >= 0 or a timedelta, not {delay!r}.")
        timeout = getattr(task, "timeout", None)
        if timeout is not None and not _is_positive_number(timeout):
            raise InvalidTask(
                f"timeout must be a positive number of seconds or None, not {timeout!r}."
            )
        window = getattr(task, "unique_for", None)
        if window is not None and (not isinstance(window, timedelta) or window <= timedelta(0)):
            raise InvalidTask(
                f"unique_for must be a positive timedelta (longer than 0 seconds) or None, "
                f"not {window!r}."
            )

    # --- configuration ----------------------------------------------------------------------
    def queue_model(self, queue_name: str) -> Any:
        """The queue model of ``queue_name`` (``QueueConfigurationError`` without the app
        installed: its queue and results are not declared then)."""
        if not apps.is_installed(APP):
            raise QueueConfigurationError(
                f"TASKS[{self.alias!r}] uses QueueBackend, but {APP!r} is not in "
                "INSTALLED_APPS (system check spanner_queues.E104)."
            )
        return get_queue(self.queue_models.get(queue_name, DEFAULT_QUEUE_MODEL))

    def all_queue_models(self, *, declared_only: bool = False) -> list[Any]:
        """Every queue model this backend sends to (the default one included);
        ``declared_only``: leave out labels that name no declared queue (E102) instead of
        raising ``UnknownQueue``."""
        labels = {DEFAULT_QUEUE_MODEL, *self.queue_models.values()}
        out = []
        for label in sorted(labels):
            try:
                out.append(get_queue(label))
            except QueueError:
                if not declared_only:
                    raise
        return out

    def queues_of(self, result_id: str) -> list[Any]:
        """The queue models a task of ``result_id`` can be in: the one its id names
        (``new_result_id``), every one for an id of release 0.1.0 (which names none), else none."""
        if LEGACY_RESULT_ID.fullmatch(result_id):
            return self.all_queue_models()
        tag = result_id.rpartition("-")[2]
        return [m for m in self.all_queue_models() if queue_tag(m) == tag][:1]

    def databases(self) -> list[str]:
        """The databases of this backend's queues (its result rows live beside them)."""
        seen: list[str] = []
        for model in self.all_queue_models():
            db = engine_for(model).database
            if db not in seen:
                seen.append(db)
        return seen

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        yield from check_django_tasks_installed()
        yield from self._check_options()
        models = self.options.get("QUEUE_MODELS", {}) if isinstance(self.options, dict) else {}
        for name, label in models.items() if isinstance(models, dict) else []:
            where = f"TASKS[{self.alias!r}]['OPTIONS']['QUEUE_MODELS'][{name!r}]"
            try:
                model = get_queue(label)
            except Exception as exc:
                yield checks.Error(
                    f"{where} = {label!r} is not a declared queue ({exc}).",
                    hint="Name a queue model of an app in INSTALLED_APPS ('app_label.Model', "
                    "declared as in docs/howto/tasks.md, 'Several queues'), or remove the "
                    f"entry: queue_name {name!r} then goes to {DEFAULT_QUEUE_MODEL}.",
                    id="spanner_queues.E102",
                )
                continue
            max_length = getattr(model._meta.pk, "max_length", None)
            if max_length is None or max_length < 64 or payload_type(model) != JSON:
                yield checks.Error(
                    f"{where}: {model._meta.label} needs a CharField primary key of at least "
                    '64 characters (the task result id) and QueueMeta.payload_type = "json".',
                    hint="Declare it with `id = models.CharField(max_length=64, "
                    'primary_key=True)` and `class QueueMeta: payload_type = "json"`.',
                    id="spanner_queues.E102",
                )

    def _check_options(self) -> Iterable[checks.CheckMessage]:
        """E103: unknown ``OPTIONS`` keys and wrong values (left out by ``__init__``)."""
        where = f"TASKS[{self.alias!r}]['OPTIONS']"
        if not isinstance(self.options, dict):
            yield checks.Error(
                f"{where} must be a dict, not {type(self.options).__name__}.",
                hint=f"Known options: {', '.join(sorted(OPTIONS))}.",
                id="spanner_queues.E103",
            )
            return
        for key in sorted(set(self.options) - OPTIONS, key=str):
            yield checks.Error(
                f"{where} has the unknown option {key!r}.",
                hint=f"Known options: {', '.join(sorted(OPTIONS))}.",
                id="spanner_queues.E103",
            )
        models = self.options.get("QUEUE_MODELS", {})
        if not isinstance(models, dict) or not all(isinstance(v, str) for v in models.values()):
            yield checks.Error(
                f"{where}['QUEUE_MODELS'] must map queue names to queue labels, not {models!r}.",
                hint='For example {"emails": "shop.EmailTasks"}.',
                id="spanner_queues.E103",
            )
        atomic = self.options.get("ATOMIC_TASKS", True)
        if not isinstance(atomic, bool):
            yield checks.Error(
                f"{where}['ATOMIC_TASKS'] must be True or False, not {atomic!r}.",
                hint="A string such as 'False' would read as true.",
                id="spanner_queues.E103",
            )
        retention = self.options.get("RESULT_RETENTION_SECONDS")
        if retention is not None and not _is_positive_number(retention):
            yield checks.Error(
                f"{where}['RESULT_RETENTION_SECONDS'] must be a positive number of seconds or "
                f"None, not {retention!r}.",
                hint="For example 7 * 24 * 3600 (a week); None keeps every result.",
                id="spanner_queues.E103",
            )

    # --- enqueue ----------------------------------------------------------------------------
    def enqueue(self, task: Task[P, T], args: P.args, kwargs: P.kwargs) -> TaskResult[T]:  # type: ignore[valid-type]
        """Write the result row and send the task's message in the caller's transaction."""
        self.validate_task(task)
        model = self.queue_model(task.queue_name)
        db = engine_for(model).database
        now = clock.now()
        result: TaskResult[T] = TaskResult(
            task=task,
            id=new_result_id(model),
            status=TaskResultStatus.READY,
            enqueued_at=now,
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        pk_name = model._meta.pk.name
        payload = payload_of(result, queue_name=task.queue_name, enqueued_at=now)
        window: timedelta | None = getattr(task, "unique_for", None)

        def write() -> bool:
            if window is not None:
                same = key_text([task.module_path, payload["args"], payload["kwargs"]])
                if not uniqueness.claim(model._meta.label, [same], window, using=db)[0]:
                    return False
            key: dict[str, Any] = {pk_name: result.id}
            api.send(model, using=db, payload=payload, deliver_time=task.run_after, **key)
            return True

        if transaction.get_connection(db).in_atomic_block:
            with transaction.atomic(using=db, savepoint=False):  # the caller's transaction
                written = write()
        else:
            retries = engine_for(model).params.transaction_retries
            written = run_in_transaction(write, using=db, retries=retries)
        if not written:
            return dataclasses.replace(result, enqueued_at=None)
        task_enqueued.send(type(self), task_result=result)
        return result

    # --- results ----------------------------------------------------------------------------
    def get_result(self, result_id: str) -> TaskResult:
        """The result of task ``result_id``, as stored now: its result row once it finished
        (or, on native queues, started), else its message: ``RUNNING`` while a worker holds
        its lease, ``READY`` before."""
        # the id names its queue model (``new_result_id``): one read of the result rows beside
        # it, one of its queue; an id naming none of this backend's: the result rows alone
        candidates = self.queues_of(result_id)
        databases = list(dict.fromkeys(engine_for(m).database for m in candidates))
        for db in databases or self.databases():
            record = TaskResultRecord.objects.using(db).filter(id=result_id).first()
            if record is not None:
                return result_from_record(record)
        now = clock.now()
        for model in candidates:
            engine = engine_for(model)
            if not engine.features.supports_listing:
                continue
            row = rows(model, engine.database).filter(pk=result_id).first()
            if row is not None:
                message = row_to_message(model, row)
                record = record_from_payload(message.json(), queue=model._meta.label)
                if record is not None:
                    held = message.lease_expires_at is not None and message.lease_expires_at > now
                    record.status = RUNNING if held else READY
                    # the workers of its earlier runs (max_attempts), and of this message's
                    # deliveries, the one holding it now included: not recorded
                    workers = [*record.worker_ids, *[UNKNOWN_WORKER] * (message.attempt or 0)]
                    record.worker_ids_json = dumps(workers)
                    record.attempts = len(workers)
                    return result_from_record(record)
        for db in databases:  # (it finished between the two reads: its row is there)
            record = TaskResultRecord.objects.using(db).filter(id=result_id).first()
            if record is not None:
                return result_from_record(record)
        raise TaskResultDoesNotExist(result_id)

    def prune_results(self, *, now: Any = None) -> int:
        """Delete finished results older than ``RESULT_RETENTION_SECONDS``; return how many."""
        if self.result_retention is None:
            return 0
        cutoff = (now or clock.now()) - self.result_retention
        deleted = 0
        for db in self.databases():
            deleted += (
                TaskResultRecord.objects.using(db)
                .filter(status__in=FINISHED, finished_at__lt=cutoff)
                .delete()[0]
            )
        return deleted


def queue_tag(model: Any) -> str:
    """Eight hex digits naming the queue model labelled as ``model`` in its tasks' ids."""
    return hashlib.sha256(model._meta.label.encode()).hexdigest()[:8]


def new_result_id(model: Any) -> str:
    """A new task's result id: the framework's 32 random characters, ``-``, and the tag of
    its queue model (``queue_tag``), so ``get_result`` reads that queue alone (41 characters:
    a task queue's key holds 64)."""
    return f"{get_random_id()}-{queue_tag(model)}"


def _is_positive_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")
    )


def check_django_tasks_installed(**kwargs: Any) -> list[checks.CheckMessage]:
    """E101: on Django 5.2, a ``QueueBackend`` is configured but the backport's app
    ``django_tasks`` is not installed (registered by ``runner.connect``,
    since the backport runs backend checks only when its app is installed). Django 6's
    ``django.tasks`` is not an app: nothing to install there."""
    if FRAMEWORK_APP is None or apps.is_installed(FRAMEWORK_APP):
        return []
    return [
        checks.Error(
            f"spanner_queues.contrib.tasks.QueueBackend needs {FRAMEWORK_APP!r} in "
            "INSTALLED_APPS (the django-tasks backport of django.tasks, on Django 5.2).",
            id="spanner_queues.E101",
        )
    ]


def _task_at(path: str) -> Task:
    """The task a module attribute ``path`` names (the framework's ``InvalidTask`` if
    none)."""
    try:
        task = import_string(path)
    except ImportError as exc:
        raise InvalidTask(f"{path} is not a task: {exc}") from exc
    except Exception as exc:  # its module raised on import: no task in this process either
        raise InvalidTask(f"{path} cannot be imported: {type(exc).__name__}: {exc}") from exc
    if not isinstance(task, Task):
        raise InvalidTask(f"{path} is not a task.")
    return task


#: tasks bound to a queue and backend other than their declaration's (``Task.using`` builds
#: and validates a new one), by declared task, queue name and backend; at most
#: ``_BOUND_MAX`` (then started afresh): tasks with a ``run_after`` are not kept
_bound: dict[tuple[Task, str, str], Task] = {}
_BOUND_MAX = 256


def task_of(record: TaskResultRecord) -> Task:
    """The task of a stored row, looked up by its path (the framework's ``InvalidTask``
    if the path no longer names a task in this process)."""
    task = _task_at(record.task_path)
    wanted = (record.queue_name, record.backend, record.run_after)
    if (task.queue_name, task.backend, task.run_after) == wanted:
        return task
    if record.run_after is not None:
        return task.using(queue_name=wanted[0], backend=wanted[1], run_after=wanted[2])
    key = (task, record.queue_name, record.backend)
    bound = _bound.get(key)
    if bound is None:
        bound = task.using(queue_name=wanted[0], backend=wanted[1], run_after=None)
        if len(_bound) >= _BOUND_MAX:
            _bound.clear()
        _bound[key] = bound
    return bound


def missing_task(record: TaskResultRecord) -> Task:
    """A stand-in for the task of a row whose path names no task in this process: its
    ``module_path`` is the stored path, and calling it raises ``InvalidTask``."""
    path = record.task_path
    module, _, qualname = path.rpartition(".")

    def missing(*args: Any, **kwargs: Any) -> Any:
        raise InvalidTask(f"{path} is not a task in this process.")

    missing.__module__, missing.__qualname__ = module, qualname
    missing.__name__ = qualname.rpartition(".")[2]
    task = object.__new__(Task)  # (not validated: there is no function to validate)
    for name, value in {
        "func": missing,
        "priority": record.priority,
        "backend": record.backend,
        "queue_name": record.queue_name,
        "run_after": record.run_after,
        "takes_context": record.takes_context,
    }.items():
        object.__setattr__(task, name, value)
    return task


def payload_of(result: TaskResult, *, queue_name: str, enqueued_at: Any) -> dict[str, Any]:
    """The message of an enqueued task: everything its result row will hold (the row is
    written when it finishes, in the transaction that acks the message)."""
    task = result.task
    return {
        "id": result.id,
        "task": task.module_path,
        "backend": result.backend,
        "queue_name": queue_name,
        "priority": task.priority,
        "takes_context": task.takes_context,
        "args": result.args,
        "kwargs": result.kwargs,
        "enqueued_at": enqueued_at.isoformat(),
        "run_after": task.run_after.isoformat() if task.run_after is not None else None,
        **task_options(task),
    }


def record_from_payload(data: dict[str, Any], *, queue: str) -> TaskResultRecord | None:
    """The (unsaved) ``READY`` result row of a task message; ``None`` for a message of a
    release that wrote the row at enqueue (no ``"args"``: the row holds the task)."""
    if "args" not in data:
        return None
    run_after = data.get("run_after")
    # Every field by position, in the model's order (the worker builds one a task: by keyword,
    # Django's constructor took twice as long); test_record_from_payload pins the order.
    return TaskResultRecord(
        data["id"],  # id
        data["task"],  # task_path
        data["backend"],  # backend
        data["queue_name"],  # queue_name
        queue,  # queue
        data.get("priority", 0),  # priority
        data.get("takes_context", False),  # takes_context
        READY,  # status
        dumps(data["args"]),  # args_json
        dumps(data["kwargs"]),  # kwargs_json
        "",  # return_value_json
        # (a task run again after a failed run: its earlier runs, see QueueTask.max_attempts)
        dumps(data.get("errors", [])),  # errors_json
        dumps(data.get("worker_ids", [])),  # worker_ids_json
        0,  # attempts
        datetime.fromisoformat(data["enqueued_at"]),  # enqueued_at
        datetime.fromisoformat(run_after) if run_after else None,  # run_after
        None,  # started_at
        None,  # last_attempted_at
        None,  # finished_at
    )


def result_from_record(record: TaskResultRecord, *, task: Task | None = None) -> TaskResult:
    """A ``TaskResult`` from a stored row. Its task (unless given) is looked up by path; if
    the path no longer names a task in this process, the result carries a stand-in
    (``missing_task``) whose call raises ``InvalidTask``."""
    if task is None:
        try:
            task = task_of(record)
        except InvalidTask:
            task = missing_task(record)
    result: TaskResult[Any] = TaskResult(
        task=task,
        id=record.id,
        status=TaskResultStatus(record.status),
        enqueued_at=record.enqueued_at,
        started_at=record.started_at,
        last_attempted_at=record.last_attempted_at,
        finished_at=record.finished_at,
        args=record.args,
        kwargs=record.kwargs,
        backend=record.backend,
        errors=[TaskError(**e) for e in record.errors],
        worker_ids=record.worker_ids,
    )
    if record.return_value_json:
        object.__setattr__(result, "_return_value", json.loads(record.return_value_json))
    return result

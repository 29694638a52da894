"""The receiver that runs enqueued tasks inside ``manage.py runqueueworker``.

It is registered for every queue of every ``QueueBackend`` in ``TASKS`` when the app is ready
(``connect()``), as a non-atomic receiver that manages its own transactions. The message
carries the task (``backend.payload_of``); its result row is written when it finishes:

1. Nothing is committed before the task runs: the message's lease (the worker's claim) is
   its ``RUNNING``. On engines whose rows show no lease (native queues) the result row is
   committed ``RUNNING`` first, with this process's worker id.
2. The task function runs in a transaction on the queue's database; its database writes, the
   result row (one INSERT: ``SUCCESSFUL``, the return value, worker id, times) and the ack of
   the message commit together. With ``OPTIONS["ATOMIC_TASKS"] = False`` the task runs outside
   any transaction (its writes commit as it makes them) and the row commits with the ack after
   it returns.
3. If the task raises (any ``BaseException``: ``SystemExit``, ``GeneratorExit`` and
   ``KeyboardInterrupt`` too, see below), that transaction rolls back (the task's writes with
   it, when atomic) and a second one writes ``FAILED`` with the exception class and traceback,
   and acks the message: a failed task is not run again (Django's Tasks semantics) unless its
   ``max_attempts`` (``backend.QueueTask``) leaves runs: then its message is sent again,
   carrying the errors so far, due after ``retry_delay`` (the task is ``READY``). A task whose
   function is gone (its path names no task in this process, or its module raises on import)
   is ``FAILED`` the same way (``InvalidTask``), without running, never run again.
   ``task_finished`` is then sent (its framework line says ``state=FAILED``), and the
   receiver raises ``AckedFailure``: the worker logs the failure with its traceback (task id,
   queue, attempt), the one copy of it, counts it ``failed`` and gives nothing back. (Under
   the test kit's ``drain``, which logs nothing, ``task_finished`` is sent while the exception
   is being handled: the framework's line carries the traceback.)

``KeyboardInterrupt``: Django's immediate backend lets it through ("the user tried to
terminate"), and so does the runner on the main thread (the test kit's ``drain``). The
worker runs tasks in its executor threads, where Python never delivers the user's Ctrl-C
(SIGINT is the worker's graceful stop, on the main thread): one raised there comes from the
task's own code and is a failure like any other.

Group commit (``spanner_queues.worker.group``): with ``ATOMIC_TASKS`` (the default) and where
the database has savepoints (SQLite, PostgreSQL), the worker runs several tasks in one
transaction: each transaction above is then a savepoint of the group's, and several tasks'
results and acks commit at once (``task_finished`` is sent before that commit). The new
result rows of a group are inserted in one statement (``MessageContext.write_with_group``),
after its last task and before its ack. A group that
loses a race runs its tasks again, as a lost transaction always did. Elsewhere each task runs
alone, as above.

The worker's leases, renewal, back-off and graceful stop are unchanged: a lease lost while the
task runs leaves the message to be delivered again (``RUNNING`` again, one more worker id; the
lost run's is ``"unknown"`` where it wrote no row). A message of a release that wrote the row
at enqueue (no ``"args"`` in it) runs on that row.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import connections, models
from django.db.models.sql import InsertQuery
from django.utils.module_loading import import_string

from spanner_queues import api, clock
from spanner_queues.contrib.tasks.backend import (
    QueueBackend,
    check_django_tasks_installed,
    missing_task,
    record_from_payload,
    result_from_record,
    task_of,
)
from spanner_queues.contrib.tasks.framework import (
    LOGGER,
    InvalidTask,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    get_exception_traceback,
    get_module_path,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from spanner_queues.contrib.tasks.models import (
    FAILED,
    FINISHED,
    READY,
    RUNNING,
    SUCCESSFUL,
    UNKNOWN_WORKER,
    TaskResultRecord,
    dumps,
)
from spanner_queues.drivers import driver_for, driver_of
from spanner_queues.engines import engine_for
from spanner_queues.exceptions import AckedFailure, Cancelled, MessageAlreadyAcked
from spanner_queues.message import Message
from spanner_queues.queues import get_queue
from spanner_queues.receivers import (
    ReceiverRegistry,
    ReceiverSpec,
    current_run,
    mark_acked,
    receivers,
)
from spanner_queues.signals import messages_cancelled
from spanner_queues.transactions import run_in_transaction

#: the worker id recorded in results outside a worker (the test kit's ``drain``): host and
#: process; under ``runqueueworker`` the worker's own id (``Worker.worker_id``), the one its log
#: lines and events carry
WORKER_ID = f"{socket.gethostname()}-{os.getpid()}"
RECEIVER_NAME = "spanner_queues.contrib.tasks.runner.run_task"

#: the status of a cancelled task's result: Django's ``CANCELLED`` where its Tasks API has
#: one, else ``FAILED`` (its error is the ``Cancelled``, with the reason)
CANCELLED = str(getattr(getattr(TaskResultStatus, "CANCELLED", None), "value", FAILED))
#: labels of the task queues (``connect``)
_TASK_QUEUES: set[str] = set()

#: when this process last pruned the finished results
_prunes = clock.Throttle()


class _TaskRaised(Exception):
    """Carries the task's own exception out of the transaction that ran it."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def queue_backends() -> list[Any]:
    """The configured ``TASKS`` backends that are ``QueueBackend``s (none without ``TASKS``)."""
    configured = getattr(settings, "TASKS", None) or {}
    out = []
    for alias, conf in configured.items():
        try:
            cls = import_string(conf.get("BACKEND", ""))
        except ImportError:
            continue  # django-tasks' own checks report it
        if isinstance(cls, type) and issubclass(cls, QueueBackend):
            out.append(task_backends[alias])
    return out


def connect(registry: ReceiverRegistry | None = None) -> list[str]:
    """Register ``run_task`` for the queues of every configured ``QueueBackend``; return the
    queue labels. Called from ``SpannerQueuesConfig.ready()``."""
    registry = registry if registry is not None else receivers
    logging.getLogger(LOGGER).addFilter(_NO_EMPTY_TRACEBACK)  # (once: a filter is a set member)
    labels: list[str] = []
    backends = queue_backends()
    if backends:
        checks.register(check_django_tasks_installed)
    messages_cancelled.connect(_on_cancelled, dispatch_uid="spanner_queues_tasks_cancel")
    for backend in backends:
        # (a label naming no declared queue is left out: the backend's check E102 reports it)
        for model in backend.all_queue_models(declared_only=True):
            label = model._meta.label
            if label in labels:
                continue
            labels.append(label)
            _TASK_QUEUES.add(label)
            registry.register(
                ReceiverSpec(
                    func=run_task,
                    queue=label,
                    name=RECEIVER_NAME,
                    atomic=False,
                    timeout_of=task_timeout,
                    # ATOMIC_TASKS: its transactions nest in the worker's group (savepoints),
                    # several tasks' results committing at once
                    group=bool(getattr(backend, "atomic_tasks", True)) or None,
                )
            )
    return labels


def _on_cancelled(
    sender: Any, messages: list[Message], using: str, cancellation: Any, **_: Any
) -> None:
    """``api.cancel`` of a task's message, in its transaction: a pending task's result is
    written finished (``CANCELLED``, else ``FAILED``) with the cancellation as its error. (A
    running task's result is written by its run, if it stops on the cancel.)"""
    if cancellation.running or sender._meta.label not in _TASK_QUEUES:
        return
    for message in messages:
        try:
            data = message.json()
        except Exception:
            continue  # not a task's message
        record = TaskResultRecord.objects.using(using).filter(id=data.get("id")).first()
        persisted = record is not None
        if record is None:
            record = record_from_payload(data, queue=message.queue)
        if record is None or record.status in (*FINISHED, CANCELLED):
            continue
        cancelled = Cancelled(cancellation.reason, cancellation.by)
        error = {
            "exception_class_path": get_module_path(Cancelled),
            "traceback": f"{get_module_path(Cancelled)}: {cancelled}\n",
        }
        _finish(record, using, persisted, CANCELLED, errors_json=dumps([*record.errors, error]))


def task_timeout(message: Message) -> float | None:
    """The time limit of the task of ``message`` (``@task(timeout=...)``), if it has one."""
    if b'"timeout"' not in message.payload:  # (most tasks: no JSON parsed for it)
        return None
    try:
        timeout = message.json().get("timeout")
    except Exception:  # (not a task's message: run_task says so)
        return None
    return float(timeout) if isinstance(timeout, (int, float)) else None


def run_task(message: Message) -> None:
    """Run the task of ``message`` (see the module docstring)."""
    engine = engine_for(get_queue(message.queue))
    db = engine.database
    retries = engine.params.transaction_retries
    data = message.json()
    # The row exists before the task finishes only for a message of a release that wrote it at
    # enqueue (its payload has no "args"), and on engines whose rows show no lease (RUNNING is
    # committed there, below): only then is it read first.
    rows_show_leases = engine.features.stores_bookkeeping_fields
    record: TaskResultRecord | None = None
    if "args" not in data or not rows_show_leases:
        record = TaskResultRecord.objects.using(db).filter(id=data["id"]).first()
    #: whether the row exists (and is updated, not inserted, when the task finishes)
    persisted = record is not None
    if record is None and "args" in data:
        record = record_from_payload(data, queue=message.queue)
    if record is None or record.status in (*FINISHED, CANCELLED):
        # No row (pruned, or deleted by hand) or already finished: nothing to run.
        run_in_transaction(lambda: _ack(message, db), using=db, retries=retries)
        mark_acked(message)
        return
    _start(record, message)
    if not rows_show_leases:
        # (native queues: a leased row shows no lease to get_result(): RUNNING is committed)
        run_in_transaction(lambda: _save(record, db, persisted), using=db, retries=retries)
        persisted = True
    backend = task_backends[record.backend]
    # In a group the worker acks the message with the group, in the transaction the result is
    # written in: the run leaves the ack to it (one statement for the group, not one a task).
    run = current_run()
    worker_acks = run is not None and run.acks_in_transaction and run.handles(message)
    value: Any = None
    failure: BaseException | None = None
    try:
        task = task_of(record)
    except InvalidTask as exc:  # the function is gone (or no longer a task): FAILED
        failure = exc
        task = missing_task(record)
    result = result_from_record(record, task=task)
    if failure is None:
        task_started.send(type(backend), task_result=result)
        try:
            value = _call(
                task, result, record, message, backend, db, persisted, retries, ack=not worker_acks
            )
        except _TaskRaised as raised:
            failure = raised.error
    if failure is not None:
        # (with attempts left: READY again, and AckedFailure raised)
        _record_failure(failure, record, message, data, db, persisted, retries)
    if failure is not None or not worker_acks:
        mark_acked(message)  # acked above, in the task's (or the failure's) transaction
    _report(result, record, backend, value, failure)
    _maybe_prune(backend)
    if failure is not None:
        # the worker logs it with its traceback, counts it failed, and gives nothing back
        raise AckedFailure(failure) from failure


def _call(
    task: Task,
    result: TaskResult,
    record: TaskResultRecord,
    message: Message,
    backend: Any,
    db: str,
    persisted: bool,
    retries: int,
    *,
    ack: bool = True,
) -> Any:
    """Call ``task`` and record it ``SUCCESSFUL`` with the ack (unless ``ack`` is False: the
    worker acks it in this transaction): in one transaction with the task's writes
    (``ATOMIC_TASKS``, the default), else after it ran in autocommit. Returns its value (as
    JSON would); raises ``_TaskRaised`` with what it raised."""
    # records are written by QueueBackend only; ATOMIC_TASKS defaults to True
    atomic_tasks: bool = getattr(backend, "atomic_tasks", True)

    def call() -> Any:
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
            else:
                value = task.call(*result.args, **result.kwargs)
            return normalize_json(value)
        except Exception as exc:
            if atomic_tasks and driver_for(db).is_retryable(exc):
                raise  # the transaction lost a race: run it again
            raise _TaskRaised(exc) from exc
        except BaseException as exc:  # SystemExit, GeneratorExit, KeyboardInterrupt...
            if isinstance(exc, KeyboardInterrupt) and _on_main_thread():
                raise  # maybe the user's Ctrl-C (the test kit's drain): let it through
            raise _TaskRaised(exc) from exc  # (an Exception: the transaction rolls back)

    def succeed(value: Any) -> Any:
        _finish(record, db, persisted, SUCCESSFUL, return_value_json=dumps(value), group=True)
        if ack:
            _ack(message, db)
        return value

    if atomic_tasks:  # the task's writes commit with SUCCESSFUL and the ack
        return run_in_transaction(lambda: succeed(call()), using=db, retries=retries)
    value = call()  # the task runs in autocommit; SUCCESSFUL and the ack commit after it
    return run_in_transaction(lambda: succeed(value), using=db, retries=retries)


def _record_failure(
    failure: BaseException,
    record: TaskResultRecord,
    message: Message,
    data: dict[str, Any],
    db: str,
    persisted: bool,
    retries: int,
) -> None:
    """Record a failed run in one transaction: ``FAILED`` with its error and the ack; or,
    with attempts left (``QueueTask.max_attempts``), READY again with its message due after
    the delay, and then raise ``AckedFailure`` (logged and counted: a failed run; no
    ``task_finished``)."""
    error = {
        "exception_class_path": get_module_path(type(failure)),
        "traceback": get_exception_traceback(failure),
    }
    errors = [*record.errors, error]
    runs = data.get("max_attempts", 1) if "args" in data else 1
    # (a task that stopped on a cancel is not run again, whatever max_attempts says)
    again = not isinstance(failure, (InvalidTask, Cancelled)) and len(errors) < runs
    status = CANCELLED if isinstance(failure, Cancelled) else FAILED

    def fail() -> None:
        if again:  # QueueTask.max_attempts: READY again, its message due after the delay
            _again(record, message, data, db, persisted, errors)
            return
        _finish(record, db, persisted, status, errors_json=dumps(errors))
        _ack(message, db)

    try:
        run_in_transaction(fail, using=db, retries=retries)
    except MessageAlreadyAcked:
        if not isinstance(failure, Cancelled):
            raise
        # (native queues: the cancel deleted the message and finished its result itself)
        stored = TaskResultRecord.objects.using(db).filter(id=record.id).first()
        if stored is not None:
            record.status, record.finished_at = stored.status, stored.finished_at
            record.errors_json = stored.errors_json
    if again:
        mark_acked(message)
        raise AckedFailure(failure) from failure  # logged and counted: a failed run


def _report(
    result: TaskResult,
    record: TaskResultRecord,
    backend: Any,
    value: Any,
    failure: BaseException | None,
) -> None:
    """This run's own result, set as Django's immediate backend sets its results, and
    ``task_finished``."""
    object.__setattr__(result, "status", TaskResultStatus(record.status))
    object.__setattr__(result, "finished_at", record.finished_at)
    if failure is not None:
        object.__setattr__(result, "errors", [TaskError(**e) for e in record.errors])
    else:
        object.__setattr__(result, "_return_value", value)
    _send_finished(task_finished, type(backend), result, failure)


def _start(record: TaskResultRecord, message: Message) -> None:
    """``record`` as this delivery starts it: ``RUNNING``, this worker's id appended (one id
    per delivery: the ones before it that left no row are ``UNKNOWN_WORKER``)."""
    now = clock.now()
    # the delivery count, where the engine knows it; else one more start
    attempt = message.attempt if message.attempt is not None else record.attempts + 1
    known = record.worker_ids
    earlier = max(attempt - 1, len(known))
    worker = _running_worker() or WORKER_ID
    record.worker_ids_json = dumps([*known, *[UNKNOWN_WORKER] * (earlier - len(known)), worker])
    record.attempts = max(attempt, len(known) + 1)
    record.status = RUNNING
    record.started_at = record.started_at or now
    record.last_attempted_at = now


def _running_worker() -> str | None:
    """The id of the worker running this task (None: not a worker, the test kit's drain)."""
    run = current_run()
    return run.worker_id if run is not None else None


class _NoEmptyTraceback(logging.Filter):
    """The framework's ``task_finished`` line of a failure sent outside its exception handler:
    the backport's ``logger.exception`` would print ``NoneType: None`` for its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[0] is None:
            record.exc_info = None
        return True


_NO_EMPTY_TRACEBACK = _NoEmptyTraceback()


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _send_finished(signal: Any, sender: type, result: Any, failure: BaseException | None) -> None:
    """Send ``task_finished``. A failure's traceback is logged once: under a worker or the
    test kit's ``drain`` (both settle through the worker's *apply*, which logs it with the task
    id, queue and attempt), the signal is sent as for a success (the framework's line says
    ``state=FAILED``, without the traceback again: two failures printed 119 lines); elsewhere
    while the exception is being handled, so that receivers calling ``logger.exception`` (the
    framework's own) log its traceback."""
    if failure is None or current_run() is not None:
        signal.send(sender, task_result=result)
        return
    try:
        raise failure
    except BaseException:
        signal.send(sender, task_result=result)


def _again(
    record: TaskResultRecord,
    message: Message,
    data: dict[str, Any],
    db: str,
    persisted: bool,
    errors: list[dict[str, str]],
) -> None:
    """After a failed run with runs left: the task's message sent again (this one is acked
    with it), carrying its errors and workers so far, due after its ``retry_delay``."""
    record.status = READY
    record.errors_json = dumps(errors)
    if persisted:  # (native queues: the row committed at start shows READY again)
        record.save(using=db, update_fields=["status", "errors_json"])
    model = get_queue(message.queue)
    delay = float(data.get("retry_delay", 0.0))
    payload = {**data, "errors": errors, "worker_ids": record.worker_ids}
    _ack(message, db)
    api.send(
        model,
        using=db,
        payload=payload,
        deliver_time=clock.now() + timedelta(seconds=delay),
        **{model._meta.pk.name: data["id"]},
    )


def _finish(
    record: TaskResultRecord,
    db: str,
    persisted: bool,
    status: str,
    *,
    group: bool = False,
    **fields: Any,
) -> None:
    """``record`` finished with ``status`` and ``fields``, written: with ``group``, a new row
    in a group is handed to the group (``MessageContext.write_with_group``), which inserts its
    tasks' rows in one statement before its ack."""
    record.status = status
    record.finished_at = clock.now()
    for name, value in fields.items():
        setattr(record, name, value)
    if group and not persisted:
        run = current_run()
        write = partial(_insert_many, db=db)
        if run is not None and run.write_with_group(("task results", db), record, write):
            return
    _save(record, db, persisted)


def _save(record: TaskResultRecord, db: str, persisted: bool) -> None:
    """Insert the result row (its first write: one INSERT), or update the one there."""
    if persisted:
        record.save(using=db, force_update=True)
    else:
        _insert_many([record], db)


#: per database: the result row's INSERT (one row) and its fields, compiled once by Django's
#: compiler
_inserts: dict[str, tuple[str, list[tuple[str, Any]], list[Any]]] = {}


def _insert_many(records: list[TaskResultRecord], db: str) -> None:
    """``TaskResultRecord.objects.bulk_create(records)`` without compiling the INSERT again
    for every row (that was a third of a task's time): the SQL Django compiles for one row
    of the model on ``db``, its ``VALUES`` row repeated (as many rows a statement as the
    backend's ``bulk_batch_size`` allows; where the driver pipelines ``executemany``, that one
    row's statement for every row in one ``executemany``), with the datetime values adapted as
    the model's fields adapt them. (No ``pre_save`` or ``post_save`` signal is sent: the rows
    are the worker's, written only here.)"""
    connection = connections[db]
    compiled = _inserts.get(db)
    if compiled is None:
        fields = list(TaskResultRecord._meta.local_concrete_fields)
        query = InsertQuery(TaskResultRecord)
        query.insert_values(fields, [records[0]])
        [(sql, _params)] = query.get_compiler(using=db).as_sql()
        compiled = _inserts[db] = (
            sql,
            [(f.attname, f if isinstance(f, models.DateTimeField) else None) for f in fields],
            fields,
        )
    sql, plan, fields = compiled
    driver = driver_of(connection)
    adapt = driver.datetime_param()
    adapted: dict[datetime, Any] = {}  # (a task's start and last attempt: one reading)
    params = []
    for record in records:
        for name, field in plan:
            value = getattr(record, name)
            if field is None:
                params.append(value)
            elif value is None:
                params.append(None)
            elif type(field) is models.DateTimeField and _aware(value):
                # what get_db_prep_save comes to for an aware datetime (the worker's clock
                # gives only those) on a plain DateTimeField: the backend's adapter, without
                # the field's calls (they were most of the row's parameters' cost)
                found = adapted.get(value)
                if found is None:
                    found = adapted[value] = adapt(value)
                params.append(found)
            else:
                params.append(field.get_db_prep_save(value, connection))
    width = len(plan)
    if len(records) > 1 and driver.pipelines_executemany:
        with connection.cursor() as cursor:
            cursor.executemany(sql, [params[i : i + width] for i in range(0, len(params), width)])
        return
    per = max(1, connection.ops.bulk_batch_size(fields, records)) if len(records) > 1 else 1
    head, _, row = sql.partition(" VALUES ")
    with connection.cursor() as cursor:
        for start in range(0, len(records), per):
            n = min(per, len(records) - start)
            text = sql if n == 1 else f"{head} VALUES {', '.join([row] * n)}"
            cursor.execute(text, params[start * width : (start + n) * width])


def _aware(value: Any) -> bool:
    return isinstance(value, datetime) and value.tzinfo is not None


def _ack(message: Message, db: str) -> None:
    api.ack(message, using=db)


def _maybe_prune(backend: Any) -> None:
    """At most once a minute per process: delete finished results past their retention."""
    if getattr(backend, "result_retention", None) is None:
        return
    if _prunes.due(None, 60.0):
        backend.prune_results()


__all__ = ["RECEIVER_NAME", "WORKER_ID", "connect", "run_task", "task_timeout"]

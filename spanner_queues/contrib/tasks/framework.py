"""Django's Tasks framework, wherever it is: ``django.tasks`` (Django 6.0 and later, built in)
or the ``django-tasks`` backport (``django_tasks``, an installed app, on Django 5.2).

The built-in framework wins when both are importable: Django 6 reads ``TASKS`` itself, and the
backport's handler would build a second, separate set of backends. Everything of the framework
that this app uses is imported from here, under one name each:

- ``InvalidTask``: ``django.tasks.exceptions.InvalidTask`` (the backport's ``InvalidTaskError``).
- ``FRAMEWORK_APP``: the app to add to ``INSTALLED_APPS`` (``"django_tasks"`` for the backport;
  ``None`` on Django 6, whose framework is not an app).
- ``LOGGER``: the framework's logger name (``"django.tasks"`` or ``"django_tasks"``).
"""

from __future__ import annotations

from traceback import format_exception
from typing import TYPE_CHECKING, Any

from django.utils.crypto import get_random_string

if TYPE_CHECKING:  # (mypy checks against the backport: django-stubs 5.2 has no django.tasks)
    from django_tasks import (
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

    FRAMEWORK_APP: str | None
    LOGGER: str
else:
    try:
        from django.tasks import (
            TaskContext,
            TaskResult,
            TaskResultStatus,
            default_task_backend,
            task,
            task_backends,
        )
    except ImportError:  # Django 5.2: the backport
        from django_tasks import (
            TaskContext,
            TaskResult,
            TaskResultStatus,
            default_task_backend,
            task,
            task_backends,
        )
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json

        FRAMEWORK_APP = "django_tasks"
        LOGGER = "django_tasks"
    else:
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import DEFAULT_TASK_PRIORITY, Task, TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json

        FRAMEWORK_APP = None
        LOGGER = "django.tasks"


def get_module_path(value: Any) -> str:
    """``module.qualname`` of a class or function (how the framework names them)."""
    return f"{value.__module__}.{value.__qualname__}"


def get_exception_traceback(exc: BaseException) -> str:
    return "".join(format_exception(exc))


def get_random_id() -> str:
    """A result id as the framework makes them: 32 random characters."""
    return get_random_string(32)


__all__ = [
    "DEFAULT_TASK_PRIORITY",
    "FRAMEWORK_APP",
    "LOGGER",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "default_task_backend",
    "get_exception_traceback",
    "get_module_path",
    "get_random_id",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]

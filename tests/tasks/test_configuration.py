"""A wrong ``TASKS`` setting is a system check error with a hint, never a start-up traceback;
the task models have a public import path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.core import checks

from spanner_queues.contrib.tasks import QueueBackend
from spanner_queues.contrib.tasks.runner import connect
from spanner_queues.receivers import ReceiverRegistry

ROOT = Path(__file__).resolve().parents[2]
BAD_OPTIONS = {
    "QUEUE_MODELS": {"emails": "shop.EmailTasks"},
    "RESULT_RETENTION_SECONDS": "a week",
    "ATOMIC_TASK": True,
}


@pytest.mark.engine_independent
def test_an_unknown_queue_model_does_not_break_start_up(settings) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "spanner_queues.contrib.tasks.QueueBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": BAD_OPTIONS,
        }
    }
    registry = ReceiverRegistry()
    assert connect(registry) == ["spanner_queues_tasks.TaskMessage"]  # the others: the checks


@pytest.mark.engine_independent
def test_wrong_options_are_check_errors_with_hints() -> None:
    backend = QueueBackend("bad", {"QUEUES": ["default", "emails"], "OPTIONS": BAD_OPTIONS})
    errors = {e.id: e for e in backend.check()}
    assert set(errors) == {"spanner_queues.E102", "spanner_queues.E103"}, errors
    assert all(isinstance(e, checks.Error) and e.hint for e in errors.values())
    assert "shop.EmailTasks" in errors["spanner_queues.E102"].msg
    assert "INSTALLED_APPS" in errors["spanner_queues.E102"].hint
    problems = [e.msg for e in backend.check() if e.id == "spanner_queues.E103"]
    assert any("RESULT_RETENTION_SECONDS" in m for m in problems)
    assert any("ATOMIC_TASK" in m for m in problems)


@pytest.mark.engine_independent
@pytest.mark.parametrize("options", [["ATOMIC_TASKS"], "QUEUE_MODELS", None])
def test_options_that_are_not_a_dict_are_a_check_error_not_a_traceback(options: object) -> None:
    # (__init__ runs in AppConfig.ready(): it called OPTIONS.get() before any check ran)
    backend = QueueBackend("bad", {"QUEUES": ["default"], "OPTIONS": options})
    errors = [e for e in backend.check() if e.id == "spanner_queues.E103"]
    assert errors and "must be a dict" in errors[0].msg, errors
    assert backend.queue_models == {} and backend.atomic_tasks is True


@pytest.mark.engine_independent
def test_manage_py_check_reports_the_pasted_settings_block_without_a_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**_env(), "DJANGO_SETTINGS_MODULE": "tests.tasks.settings_misconfigured"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out and "UnknownQueue" not in out, out
    assert "spanner_queues.E102" in out and "HINT:" in out, out
    assert "spanner_queues.E103" in out, out


@pytest.mark.engine_independent
def test_the_backend_without_its_app_installed_is_a_check_error_not_a_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**_env(), "DJANGO_SETTINGS_MODULE": "tests.tasks.settings_not_installed"},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out and "RuntimeError" not in out, out
    assert "spanner_queues.E104" in out, out
    assert "'spanner_queues.contrib.tasks'" in out and "HINT:" in out, out


@pytest.mark.engine_independent
def test_a_subclass_of_the_backend_without_its_app_installed_is_a_check_error(
    settings, monkeypatch
) -> None:
    from django.apps import apps

    from spanner_queues.checks import check_tasks_app

    settings.TASKS = {
        "default": {"BACKEND": "tests.tasks.custom_backend.OwnQueueBackend"},
        "other": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend"},
        "gone": {"BACKEND": "no.such.Backend"},
    }
    assert check_tasks_app() == []  # installed here
    installed = apps.is_installed
    app = "spanner_queues.contrib.tasks"
    monkeypatch.setattr(apps, "is_installed", lambda name: name != app and installed(name))
    errors = check_tasks_app()
    assert [(e.id, type(e)) for e in errors] == [("spanner_queues.E104", checks.Error)], errors
    assert "TASKS['default']" in errors[0].msg and errors[0].hint


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.engine_independent
def test_the_task_models_have_one_public_import_path() -> None:
    from spanner_queues.contrib.tasks import TaskMessage, TaskResultRecord
    from spanner_queues.contrib.tasks import models as task_models

    assert TaskResultRecord is task_models.TaskResultRecord
    assert TaskMessage is task_models.TaskMessage
    assert {"QueueBackend", "TaskMessage", "TaskResultRecord"} <= set(
        __import__("spanner_queues.contrib.tasks", fromlist=["__all__"]).__all__
    )


@pytest.mark.engine_independent
def test_the_core_app_has_no_task_models_and_its_migrations_create_none() -> None:
    """A project without the tasks app gets no task tables: the models and their migration
    belong to ``spanner_queues_tasks``, and no core migration depends on it."""
    from django.apps import apps
    from django.db.migrations.loader import MigrationLoader

    from spanner_queues.contrib.tasks import TaskMessage, TaskResultRecord

    core = {m.__name__ for m in apps.get_app_config("spanner_queues").get_models()}
    assert not core & {"TaskMessage", "TaskResultRecord"}, core
    assert TaskMessage._meta.app_label == TaskResultRecord._meta.app_label == "spanner_queues_tasks"
    loader = MigrationLoader(None, ignore_no_migrations=True)
    created = {
        (app, getattr(op, "name", ""))
        for (app, _), migration in loader.disk_migrations.items()
        for op in migration.operations
        if app in ("spanner_queues", "spanner_queues_tasks")
    }
    assert {name for app, name in created if app == "spanner_queues"}.isdisjoint(
        {"TaskMessage", "TaskResultRecord"}
    )
    assert {n for a, n in created if a == "spanner_queues_tasks"} == {
        "TaskMessage",
        "TaskResultRecord",
    }
    assert not any(
        dep[0] == "spanner_queues_tasks"
        for (app, _), migration in loader.disk_migrations.items()
        if app == "spanner_queues"
        for dep in migration.dependencies
    )


@pytest.mark.engine_independent
def test_enqueue_without_the_app_installed_says_which_app_is_missing(monkeypatch) -> None:
    """Checks do not run under gunicorn: there the enqueue itself names the missing app
    (raised before anything is written)."""
    from django.apps import apps

    from spanner_queues.exceptions import QueueConfigurationError
    from tests.tasksapp import tasks

    installed = apps.is_installed
    app = "spanner_queues.contrib.tasks"
    monkeypatch.setattr(apps, "is_installed", lambda name: name != app and installed(name))
    with pytest.raises(QueueConfigurationError, match=r"'spanner_queues\.contrib\.tasks'.*E104"):
        tasks.add.enqueue(1, 2)

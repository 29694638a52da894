"""The examples of Django's Tasks documentation (the django-tasks backport's usage guide),
unchanged, against spanner_queues.contrib.tasks.QueueBackend, run by the worker; and every python
block of docs/howto/tasks.md, run as shown (the ``shop`` blocks as a package of their own)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import django
import pytest

from spanner_queues.contrib.tasks import QueueBackend
from spanner_queues.contrib.tasks.framework import (
    FRAMEWORK_APP,
    InvalidTask,
    TaskResultStatus,
    default_task_backend,
)
from tests.tasks import docs_context
from tests.tasks.docs_examples import (
    calculate_meaning_of_life,
    create_and_enqueue_on_commit,
    process_thing,
    raise_value_error,
)
from tests.tasksapp.models import Thing

pytestmark = pytest.mark.django_db(transaction=True)


def test_enqueue_get_result_return_value_and_refresh(run_worker) -> None:
    result = calculate_meaning_of_life.enqueue()

    result_id = result.id
    # Later, somewhere else...
    assert calculate_meaning_of_life.get_result(result_id).id == result_id
    assert default_task_backend.get_result(result_id).id == result_id

    assert result.status == TaskResultStatus.READY
    run_worker(lambda: calculate_meaning_of_life.get_result(result_id).is_finished)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42
    assert result.attempts == 1
    assert result.last_attempted_at is not None


def test_task_context(run_worker) -> None:
    result = docs_context.calculate_meaning_of_life.enqueue()
    run_worker(lambda: default_task_backend.get_result(result.id).is_finished)
    result.refresh()
    assert result.return_value == 42


def test_errors(run_worker) -> None:
    result = raise_value_error.enqueue()
    run_worker(lambda: default_task_backend.get_result(result.id).is_finished)
    result.refresh()
    assert result.errors[0].exception_class == ValueError  # noqa: E721  (the docs, unchanged)
    assert isinstance(result.errors[0].traceback, str)


def test_on_commit_enqueue_of_djangos_docs_still_works(run_worker) -> None:
    create_and_enqueue_on_commit()
    from spanner_queues.contrib.tasks.models import TaskMessage

    [message] = TaskMessage.objects.all()
    assert json.loads(message.payload)["task"] == process_thing.module_path
    run_worker(lambda: default_task_backend.get_result(message.id).is_finished)
    assert default_task_backend.get_result(message.id).return_value == 1
    assert Thing.objects.count() == 1


def test_backend_introspection() -> None:
    assert default_task_backend.supports_get_result


def test_priority_example_is_refused_with_the_frameworks_error() -> None:
    """``.using(priority=10)``: queues cannot order by priority, so the backend says
    ``supports_priority = False`` and the framework refuses it."""
    with pytest.raises(InvalidTask):
        calculate_meaning_of_life.using(priority=10)


# --- docs/howto/tasks.md: every python block runs as shown -----------------------------------
ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "howto" / "tasks.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
CELERY = "(Celery"  # the page's "before" block: Celery code, not run here


def as_on_this_django(code: str) -> str:
    """A block as a project on this Django line writes it: the page imports ``django.tasks``
    (Django 6), and says to import the backport's ``django_tasks`` on Django 5.2."""
    if FRAMEWORK_APP is None:
        return code
    return code.replace(
        "from django.tasks import task  # Django 5.2: from django_tasks import task",
        "from django_tasks import task",
    )


def page_blocks() -> list[str]:
    return [as_on_this_django(code) for code in BLOCK.findall(PAGE.read_text())]


def _header(code: str) -> str:
    first = code.splitlines()[0]
    return first[2:] if first.startswith("# ") else ""


def _shop_file(code: str) -> str | None:
    """``shop/<name>.py`` for a block headed ``# shop/<name>.py[, ...]``."""
    match = re.match(r"shop/(\w+\.py)\b", _header(code))
    return match.group(1) if match else None


@pytest.fixture
def shop(tmp_path, monkeypatch):
    """The page's ``shop`` blocks as a package on ``sys.path`` (its models.py aside: a queue
    model needs an installed app, see the models test)."""
    package = tmp_path / "shop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for code in page_blocks():
        name = _shop_file(code)
        if name and name != "models.py" and CELERY not in _header(code):
            (package / name).write_text(code)
    saved = {k: v for k, v in sys.modules.items() if k == "shop" or k.startswith("shop.")}
    for k in saved:
        del sys.modules[k]
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for k in [k for k in sys.modules if k == "shop" or k.startswith("shop.")]:
        del sys.modules[k]
    sys.modules.update(saved)


@pytest.mark.engine_independent
def test_every_python_block_of_the_tasks_page_is_run_by_a_test() -> None:
    kinds = []
    for code in page_blocks():
        header = _header(code)
        if header.startswith("settings.py"):
            kinds.append("settings")
        elif CELERY in header:
            kinds.append("celery")
        elif _shop_file(code):
            kinds.append(_shop_file(code))
        elif code.startswith("from spanner_queues.contrib.tasks import"):
            kinds.append("import")
        else:
            raise AssertionError(f"a block no test runs:\n{code}")
    assert sorted(kinds) == sorted(
        [
            "settings",
            "import",
            "tasks.py",
            "views.py",
            "models.py",
            "test_tasks.py",
            "celery",
            "signup.py",
            "billing.py",
            "indexing.py",
        ]
    )


def test_the_cancel_example_runs_to_its_end_outside_a_worker(shop) -> None:
    """Outside a worker ``current_run()`` is None: the task runs all its steps."""
    from shop.indexing import rebuild_index  # type: ignore[import-not-found]

    assert rebuild_index.call(3) is None


def _block(kind: str) -> str:
    for code in page_blocks():
        if (
            (kind == "settings" and _header(code).startswith("settings.py"))
            or (kind == "import" and code.startswith("from spanner_queues.contrib.tasks import"))
            or (_shop_file(code) == kind and CELERY not in _header(code))
        ):
            return code
    raise AssertionError(kind)


@pytest.mark.engine_independent
def test_the_settings_block_passes_the_checks_and_its_optional_line_is_a_check_error() -> None:
    namespace: dict = {}
    exec(_block("settings"), namespace)
    apps = namespace["INSTALLED_APPS"]
    assert {"spanner_queues", "spanner_queues.contrib.tasks"} <= set(apps)
    assert ("django_tasks" in apps) == (FRAMEWORK_APP is not None)
    backend = QueueBackend("default", namespace["TASKS"]["default"])
    assert list(backend.check()) == []
    uncommented = _block("settings").replace('# "QUEUE_MODELS"', '"QUEUE_MODELS"')
    assert uncommented != _block("settings")
    exec(uncommented, namespace)  # without a shop app: E102, no exception
    backend = QueueBackend("default", namespace["TASKS"]["default"])
    assert [e.id for e in backend.check()] == ["spanner_queues.E102"]


@pytest.mark.engine_independent
def test_the_first_example_mails_without_an_smtp_server() -> None:
    """The task block sends mail: in a ``startproject`` project (Django's SMTP backend on
    localhost:25) it failed; the settings block prints the mail instead."""
    assert "send_mail(" in _block("tasks.py")
    namespace: dict = {}
    exec(_block("settings"), namespace)
    assert namespace.get("EMAIL_BACKEND") == "django.core.mail.backends.console.EmailBackend"


@pytest.mark.engine_independent
def test_the_import_block() -> None:
    namespace: dict = {}
    exec(_block("import"), namespace)
    assert namespace["TaskResultRecord"]._meta.label == "spanner_queues_tasks.TaskResultRecord"
    assert namespace["TaskMessage"]._meta.label == "spanner_queues_tasks.TaskMessage"


@pytest.mark.engine_independent
def test_the_queue_model_block_is_the_queue_model_the_tests_run_tasks_on() -> None:
    """A queue model needs an installed app and a migration: the page's ``EmailTasks`` is
    ``tests.tasksapp.models.EmailTasks`` (mapped by ``QUEUE_MODELS`` in the tests' settings),
    statement for statement; its imports run."""
    import ast
    import inspect

    from tests.tasksapp import models as tasksapp_models

    code = _block("models.py")
    tree = ast.parse(code)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    exec(compile(ast.Module(body=imports, type_ignores=[]), "tasks.md", "exec"), {})
    [documented] = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    real = ast.parse(inspect.getsource(tasksapp_models.EmailTasks)).body[0]
    real.body = [
        n
        for n in real.body
        if not (  # (its docstring)
            isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
        )
    ]
    assert ast.dump(documented) == ast.dump(real)


@pytest.mark.django_db(transaction=True)
def test_the_task_and_view_blocks_enqueue_in_the_request_and_the_task_sends_the_mail(
    shop,
) -> None:
    from django.contrib.auth.models import User
    from django.core import mail
    from django.test import RequestFactory
    from shop.views import sign_up  # the page's blocks, as written

    from spanner_queues.contrib.tasks import TaskMessage
    from spanner_queues.testing import drain

    response = sign_up(RequestFactory().post("/", {"username": "ada", "email": "a@b.example"}))
    assert response.status_code == 201
    user = User.objects.get(username="ada")
    [message] = TaskMessage.objects.all()
    waiting = default_task_backend.get_result(message.id)
    assert waiting.task.module_path == "shop.tasks.email_welcome"
    assert waiting.args == [user.pk] and waiting.status == TaskResultStatus.READY
    drain("spanner_queues_tasks.TaskMessage", expect=1)
    result = default_task_backend.get_result(message.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 1
    assert mail.outbox[0].to == ["a@b.example"]


@pytest.mark.skipif(django.VERSION[:2] == (6, 0), reason="Django 6.0's @task takes no options")
def test_the_task_options_block_declares_a_task_with_this_backends_options(shop) -> None:
    from shop.billing import charge

    assert (charge.max_attempts, charge.retry_delay, charge.timeout) == (3, 60, 30)


@pytest.mark.django_db(transaction=True)
def test_the_test_block_passes(shop) -> None:
    from shop.test_tasks import test_email_welcome_sends_the_mail

    test_email_welcome_sends_the_mail(db=None)


@pytest.mark.django_db(transaction=True)
def test_the_celery_migration_after_block(shop) -> None:
    from shop.signup import sign_up

    from spanner_queues.testing import drain

    user = sign_up("bob", "bob@b.example")
    outcomes = drain("spanner_queues_tasks.TaskMessage", expect=1)
    assert len(outcomes.acked) == 1
    from django.core import mail

    assert mail.outbox[0].to == [user.email]

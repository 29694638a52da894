"""The how-to pages say what the code does: the defaults they name for ``runqueueworker`` are the
command's own, and the snippets of ``docs/howto/testing.md`` run as shown."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from spanner_queues.management.commands.runqueueworker import Command

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
pytestmark = pytest.mark.engine_independent  # the pages and the code, no database


def _argparse_defaults() -> dict[str, Any]:
    parser = Command().create_parser("manage.py", "runqueueworker")
    return {
        option: action.default
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--")
    }


def _is_number(text: str) -> bool:
    return re.fullmatch(r"\d+(\.\d+)?", text) is not None


def test_commands_reference_states_the_argparse_defaults() -> None:
    """Each option's "default" cell is the parser's default: a number where the parser has one,
    a word (adaptive, off, none, ...) where it has ``None``/``False``."""
    defaults = _argparse_defaults()
    text = (DOCS / "reference" / "commands.md").read_text()
    rows = re.findall(r"^\| `(--[a-z-]+)[^`]*` \| ([^|]+) \|", text, re.M)
    assert len(rows) >= 10
    for option, cell in rows:
        cell = cell.strip().strip("`")
        default = defaults[option]
        if default is None or default is False:
            assert not _is_number(cell), f"{option}: documented {cell!r}, the parser has none"
        elif isinstance(default, (int, float)):
            assert _is_number(cell) and float(cell) == default, (option, cell, default)
        else:
            assert cell == str(default), (option, cell, default)


#: "`--prefetch 1` (the default)", "`--batch-size 10` (default)" in running text
_NAMED_DEFAULT = re.compile(r"`(--[a-z-]+) ([^`]+)` \((?:the )?default\)")


def test_howto_pages_name_the_argparse_defaults() -> None:
    defaults = _argparse_defaults()
    for page in sorted((DOCS / "howto").rglob("*.md")):
        for option, value in _NAMED_DEFAULT.findall(page.read_text()):
            default = defaults[option]
            assert default is not None and str(default) == value, (
                f"{page.name}: `{option} {value}` is called the default; the command's is "
                f"{'adaptive/none' if default is None else default}"
            )


# --- docs/howto/testing.md: the page's project, built and tested --------------------------------
_BLOCK = re.compile(r"^```(python|ini)\n(.*?)^```", re.S | re.M)


def _blocks(text: str) -> list[str]:
    return [code for _lang, code in _BLOCK.findall(text)]


def _as_on_this_django(code: str) -> str:
    """A block as a project on this Django line writes it: the pages import ``django.tasks``
    (Django 6) and say to import the backport's ``django_tasks`` on Django 5.2."""
    import django

    if django.VERSION >= (6,):
        return code
    return code.replace(
        "from django.tasks import task  # Django 5.2: from django_tasks import task",
        "from django_tasks import task",
    )


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{output}"
    return output


@pytest.mark.slow
def test_testing_page_snippets_run_as_shown(tmp_path: Path) -> None:
    """The quickstart's project plus every block of "Test your app..." (each names its file and
    has its imports), then ``pytest`` with the page's ``pytest.ini``: every test passes."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SQ_", "PYTEST"))}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's spanner_queues
    _run(["-m", "django", "startproject", "mysite", str(tmp_path)], ROOT, env)
    _run(["manage.py", "startapp", "tasks"], tmp_path, env)
    installed, databases, model = _blocks((DOCS / "quickstart.md").read_text())[:3]
    assert installed.startswith("INSTALLED_APPS") and databases.startswith("DATABASES")
    with (tmp_path / "mysite" / "settings.py").open("a") as settings:
        settings.write("\n" + installed + "\n" + databases)
    (tmp_path / "tasks" / "models.py").write_text(model)

    page = (DOCS / "howto" / "testing.md").read_text()
    own = page.split("## Test your app on SQLite", 1)[1]
    files: dict[str, str] = {}
    for code in _blocks(own):
        header = re.match(r"# (\S+\.(?:py|ini))\n", code)
        assert header, f"a block of testing.md does not name its file:\n{code}"
        files[header.group(1)] = _as_on_this_django(code)
    assert {"pytest.ini", "conftest.py", "tasks/tests.py", "mysite/settings_test.py"} <= set(files)
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    tests = sum(len(re.findall(r"^ *def test_", code, re.M)) for code in files.values())
    assert tests >= 8

    _run(["manage.py", "makemigrations", "tasks"], tmp_path, env)
    _run(["manage.py", "check", "--fail-level", "WARNING", "--settings", "mysite.settings_test"],
         tmp_path, env)  # fmt: skip
    output = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider"], tmp_path, env)
    assert re.search(rf"\b{tests} passed\b", output) and "skipped" not in output, output


# --- docs/quickstart.md: the project, its receiver and the worker -------------------------------
@pytest.mark.slow
def test_quickstart_receiver_and_worker_run_as_shown(tmp_path: Path) -> None:
    """The quickstart's project (its settings, queue and ``tasks/receivers.py`` blocks): the
    message of step 9 is shown in the admin, the worker runs the receiver and acks it, printing
    the lines the page shows (its lifecycle lines too: a new project has no ``LOGGING``)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SQ_", "PYTEST"))}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's spanner_queues
    page = (DOCS / "quickstart.md").read_text()
    _run(["-m", "django", "startproject", "mysite", str(tmp_path)], ROOT, env)
    _run(["manage.py", "startapp", "tasks"], tmp_path, env)
    blocks = _blocks(page)
    installed, databases, model = blocks[:3]
    [receivers] = [b for b in blocks if b.startswith("# tasks/receivers.py\n")]
    with (tmp_path / "mysite" / "settings.py").open("a") as settings:
        settings.write("\n" + installed + "\n" + databases)
    (tmp_path / "tasks" / "models.py").write_text(model)
    (tmp_path / "tasks" / "receivers.py").write_text(receivers)
    _run(["manage.py", "makemigrations", "tasks"], tmp_path, env)
    _run(["manage.py", "migrate", "-v0"], tmp_path, env)
    step_9 = page.split("## 9.", 1)[1]
    [send] = re.findall(r"```pycon\n(.*?)```", step_9, re.S)
    code = "\n".join(line[4:] for line in send.splitlines() if line.startswith((">>> ", "... ")))
    admin = """
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
User.objects.create_superuser("admin", "admin@example.com", "pw")
client = Client()
client.force_login(User.objects.get(username="admin"))
print("OVERVIEW", client.get("/admin/spanner_queues/queues/").content.decode())
"""
    shown = _run(["manage.py", "shell", "-c", code + "\n" + admin], tmp_path, env)
    assert re.search(r"tasks\.\s*UserTasks", shown), shown
    worker = _run(["manage.py", "runqueueworker", "--burst", "-v2"], tmp_path, env)
    assert "runqueueworker " in worker and ": queues tasks.UserTasks; concurrency 1" in worker
    assert "worker " in worker and " started: queues=tasks.UserTasks concurrency=1" in worker
    assert "acked         tasks.UserTasks(user_id=1, message_id='welcome') attempt=1" in worker
    assert "depth: tasks.UserTasks=0 (ready 0, leased 0)" in worker, worker
    welcomed = "from django.contrib.auth.models import User\n"
    welcomed += "print('FIRST', User.objects.get(username='grace').first_name)"
    assert "FIRST Welcomed" in _run(["manage.py", "shell", "-c", welcomed], tmp_path, env)


# --- every how-to's settings compose ----------------------------------------------------------
def _settings_block(page: str, header: str) -> str:
    for code in _blocks((DOCS / page).read_text()):
        if code.startswith(f"# {header}\n"):
            return code
    raise AssertionError(f"{page} has no block headed {header!r}")


def _apps_of(code: str, modules: dict[str, dict[str, Any]], monkeypatch: Any) -> list[str]:
    """``INSTALLED_APPS`` after running a settings block whose ``from mysite.settings...``
    imports read ``modules`` (name -> namespace), as Django would."""
    import sys
    import types

    for name, values in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(values)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "mysite", types.ModuleType("mysite"))
    # (the emulator helpers start servers: not the point here)
    code = "\n".join(line for line in code.splitlines() if not line.startswith("ensure_"))
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    return list(namespace["INSTALLED_APPS"])


def test_each_how_tos_settings_compose_with_those_a_project_followed_before(
    monkeypatch: Any,
) -> None:
    """A project that followed the quickstart and the Tasks how-to (and the Cloud Spanner one:
    ``django_spanner`` first), then the testing how-to's test settings and the emulator's on top
    of them, has each app once: a second ``django_tasks`` or ``django_spanner`` is Django's
    "Application labels aren't unique" at start-up."""
    quickstart = _blocks((DOCS / "quickstart.md").read_text())[0]
    namespace: dict[str, Any] = {}
    exec(quickstart, namespace)
    tasks_page: dict[str, Any] = {}
    exec(_settings_block("howto/tasks.md", "settings.py"), tasks_page)
    for spanner_first in ([], ["django_spanner"]):
        project = [*spanner_first, *namespace["INSTALLED_APPS"]]
        project += [a for a in tasks_page["INSTALLED_APPS"] if a not in project]
        settings = {"INSTALLED_APPS": project}
        test_apps = _apps_of(
            _settings_block("howto/testing.md", "mysite/settings_test.py"),
            {"mysite.settings": settings},
            monkeypatch,
        )
        assert len(test_apps) == len(set(test_apps)), test_apps
        assert "spanner_queues.contrib.tasks" in test_apps
        for page, header, base in (
            ("howto/testing.md", "mysite/settings_test_spanner.py", {"INSTALLED_APPS": test_apps}),
            ("howto/emulator.md", "mysite/settings_emulator_native.py", settings),
        ):
            apps = _apps_of(
                _settings_block(page, header),
                {"mysite.settings": settings, "mysite.settings_test": base},
                monkeypatch,
            )
            assert len(apps) == len(set(apps)), (page, apps)
            assert apps[0] == "django_spanner"


# --- the optional apps' pages: each file a block shows has its imports -----------------------
def _undefined_names(code: str) -> set[str]:
    """The names ``code`` reads that it neither imports, defines nor assigns (nor are
    builtins): what a ``NameError`` would name once the file runs."""
    import builtins
    import symtable

    top = symtable.symtable(code, "<snippet>", "exec")
    defined = set(dir(builtins)) | {
        s.get_name()
        for s in top.get_symbols()
        if s.is_assigned() or s.is_imported() or s.is_namespace()
    }
    missing: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        missing.update(
            s.get_name()
            for s in table.get_symbols()
            if s.is_referenced() and (table is top or s.is_global()) and s.get_name() not in defined
        )
        tables += table.get_children()
    return missing


@pytest.mark.parametrize("page", ["tasks.md", "pubsub.md", "tracing.md", "metrics.md"])
def test_each_file_a_howto_shows_imports_what_it_uses(page: str) -> None:
    """A Python block headed by the file it goes in (``# shop/models.py``) is pasted as it is:
    every name it uses is imported or defined in it (tracing.md's model used an undefined
    ``new_id``; pubsub.md's service B had no imports)."""
    files = [
        code
        for code in _blocks((DOCS / "howto" / page).read_text())
        if re.match(r"# \S+\.py\b", code)
    ]
    assert files
    undefined = {code.splitlines()[0]: sorted(_undefined_names(code)) for code in files}
    assert {header: names for header, names in undefined.items() if names} == {}


def test_tracing_page_shows_spans_without_a_collector() -> None:
    """A newcomer sees a trace before running a collector: the console exporter."""
    blocks = _blocks((DOCS / "howto" / "tracing.md").read_text())
    assert any("ConsoleSpanExporter()" in code and "set_tracer_provider" in code for code in blocks)


def test_pubsub_page_starts_the_emulator_by_a_path_debian_has() -> None:
    """Debian's launcher is not on ``PATH``: the page gives its path and the kit's finder."""
    from spanner_queues.testing.pubsub import CANDIDATES

    page = (DOCS / "howto" / "pubsub.md").read_text()
    assert f"{CANDIDATES[0]} --host=127.0.0.1 --port=8085" in page
    assert "find_pubsub_emulator" in page


def test_unlimited_attempts_are_said_where_a_receiver_and_a_queue_are_declared() -> None:
    """``max_attempts`` is None by default: the receivers page says it before its first
    section, the ``QueueMeta`` reference before its table."""
    from spanner_queues.options import queue_options
    from spanner_queues.testing.conformance.models import Jobs

    assert queue_options(Jobs).max_attempts is None  # (a queue whose QueueMeta sets none)
    receivers = (DOCS / "howto" / "receivers.md").read_text().split("\n## ", 1)[0]
    assert "retried for ever by default" in receivers and "max_attempts" in receivers
    meta = (DOCS / "reference" / "settings.md").read_text().split("## `QueueMeta`", 1)[1]
    assert "unlimited by default" in meta.split("| option |", 1)[0]


def test_the_docs_count_the_demos_queues_as_it_declares_them() -> None:
    """13 queue models, 3 of them the shipping service's (Pub/Sub): the pages said 11, ten
    and nine."""
    root = ROOT / "demo_project"
    declared = {
        p.parent.name: len(re.findall(r"^class \w+\(Queue\):", p.read_text(), re.M))
        for p in root.glob("*/models.py")
    }
    total, shipping = sum(declared.values()), declared["shipping"]
    assert (total, shipping) == (13, 3)
    page = " ".join((DOCS / "howto" / "cloud-spanner.md").read_text().split())
    assert f"The demo declares {total} queues ({total - shipping} without the shipping" in page
    assert f"For the demo's {total - shipping} queues on native queues" in page
    settings = (root / "settings.py").read_text()
    assert "nine queues" not in settings and f"of the {total}" in settings

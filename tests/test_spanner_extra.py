"""The Spanner driver is the `spanner` extra: a project on another database imports none of it,
and a project configured for Spanner without it is told so by check E014."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core import checks
from django.test import override_settings

import spanner_queues
from spanner_queues.checks import check_queues, check_spanner_packages

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(spanner_queues.__file__).resolve().parent
pytestmark = [
    pytest.mark.engine_independent,  # settings and imports, no database
    # the checks read DATABASES only; no connection of the added alias is opened
    pytest.mark.filterwarnings("ignore:Overriding setting DATABASES:UserWarning"),
]

#: what a project not on Spanner never imports (and need not install)
SPANNER_MODULES = ("google", "grpc", "django_spanner")


def _e014(messages: list[checks.CheckMessage]) -> list[checks.CheckMessage]:
    return [m for m in messages if m.id == "spanner_queues.E014"]


def _spanner_database() -> dict:
    return {**settings.DATABASES, "spanner": {"ENGINE": "django_spanner", "NAME": "db"}}


def test_a_spanner_database_without_the_driver_is_check_error_e014(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "django_spanner", None)  # cannot be imported
    with override_settings(DATABASES=_spanner_database()):
        [error] = _e014(check_spanner_packages())
        assert _e014(check_queues()) == []  # reported once, by the check of the models tag
    assert error.level == checks.ERROR
    assert error.msg == (
        "DATABASES['spanner']['ENGINE'] = 'django_spanner', but django-google-spanner is not "
        "installed."
    )
    assert "pip install 'spanner-queues[spanner]'" in str(error.hint)


def test_the_native_engine_without_googles_client_is_e014_and_not_an_import_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "google.cloud.spanner_v1", None)
    native = {
        "default": {"ENGINE": "table"},
        "spanner": {"ENGINE": "native", "DATABASE": "spanner"},
    }
    with override_settings(DATABASES=_spanner_database(), SPANNER_QUEUES=native):
        problems = check_spanner_packages() + check_queues()
    native_errors = [m.msg for m in _e014(problems) if m.msg.startswith("SPANNER_QUEUES")]
    if importlib.util.find_spec("django_spanner") is not None:
        assert native_errors == [
            "SPANNER_QUEUES['spanner'] uses the native engine (Spanner queues), but "
            "google-cloud-spanner is not installed."
        ]
    else:  # neither is (the Django 6.1 line)
        assert native_errors == [
            "SPANNER_QUEUES['spanner'] uses the native engine (Spanner queues), but "
            "django-google-spanner and google-cloud-spanner are not installed."
        ]
    assert [m for m in problems if m.id == "spanner_queues.E001"] == []


def test_with_the_driver_installed_there_is_no_e014() -> None:
    pytest.importorskip("django_spanner")
    with override_settings(DATABASES=_spanner_database()):
        assert _e014(check_spanner_packages()) == []


def test_a_project_on_sqlite_imports_nothing_of_the_spanner_driver() -> None:
    """Every module of the package but the native engine's, the testing side, the drill
    (whose Google import is guarded) and the Pub/Sub app (Google's Pub/Sub client, the `pubsub`
    extra), and `manage.py check`: no Google, gRPC or django_spanner module is loaded (so the
    `spanner` extra need not be installed)."""
    skip = ("engines/native/", "testing/", "contrib/drill/", "contrib/pubsub/")
    modules = sorted(
        "spanner_queues." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
        for p in PACKAGE.rglob("*.py")
        if "migrations" not in p.parts and not p.relative_to(PACKAGE).as_posix().startswith(skip)
    )
    modules = [m.removesuffix(".__init__") for m in modules]
    code = (
        "import importlib, sys, django\n"
        "django.setup()\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "from django.core.management import call_command\n"
        "call_command('check', verbosity=0)\n"
        f"print(sorted(n for n in sys.modules if n.split('.')[0] in {SPANNER_MODULES!r}))\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    env.pop("SPANNER_EMULATOR_HOST", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"  # after check's "no issues" line
    assert len(modules) > 50  # the walk found the package


def test_a_spanner_database_without_the_driver_stops_django_setup_with_e014() -> None:
    """Before any model is built: Django itself would stop on the missing backend first."""
    code = (
        "import sys\n"
        "sys.modules['django_spanner'] = None  # not installed\n"
        "from django.conf import settings\n"
        "settings.configure(INSTALLED_APPS=['django.contrib.contenttypes', 'django.contrib.auth',"
        " 'spanner_queues'], DATABASES={'default': {'ENGINE': 'django_spanner', 'NAME': 'db'}},"
        " USE_TZ=True)\n"
        "import django\n"
        "django.setup()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "django.core.exceptions.ImproperlyConfigured: DATABASES['default']['ENGINE'] = "
        "'django_spanner', but django-google-spanner is not installed: "
        "pip install 'spanner-queues[spanner]'. (spanner_queues.E014)"
    )


def test_queuegrants_runs_without_the_spanner_extra() -> None:
    """``queuegrants`` only prints GRANT text: without Google's client, gRPC or the driver it
    prints the grants of a project's queues (it named the dialect's SQL through the native
    engine's package, which imports Google's client)."""
    code = (
        "import sys\n"
        f"for name in {SPANNER_MODULES!r}:\n"
        "    sys.modules[name] = None  # not installed\n"
        "import django\n"
        "django.setup()\n"
        "from django.core.management import call_command\n"
        "call_command('queuegrants', '--role-sender', 'web', '--role-worker', 'worker',"
        " '--queue', 'testapp.Emails')\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    env.pop("SPANNER_EMULATOR_HOST", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "GRANT INSERT ON TABLE testapp_emails TO ROLE web;" in done.stdout.splitlines()

"""The conformance suite's pytest plugin: the engine under test, the ``requires``/``unless``
gates, the test tiers.

    pytest -p spanner_queues.testing.conformance.plugin --sq-conformance=ALIAS --ds=SETTINGS

``--sq-conformance=ALIAS`` runs the suite (it adds the suite's package to the run; no path
needed) on the engine ``SPANNER_QUEUES[ALIAS]`` configures: for the run that configuration is
the ``default`` alias, which the suite's queues (``spanner_queues.testing.conformance`` in
``INSTALLED_APPS``) and every queue without ``QueueMeta.engine`` use. Without the option the
plugin adds no tests and gates on ``default``.

Markers: ``requires(*flags)`` runs a test only where the engine under test has these
``EngineFeatures`` flags and ``unless(*flags)`` only where it lacks them (skipped otherwise, by
the flags, never by name); the tiers ``unit``, ``conformance``, ``integration`` and ``e2e``
(see ``tier_of``), set on every collected test so ``-m`` selects them.

``-p`` imports this module before ``django.setup()``: it imports no model (nor anything that
does) and reads settings only in its hooks and fixtures.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.test.signals import setting_changed

from spanner_queues.conf import DEFAULT_SETTING
from spanner_queues.engines import engines
from spanner_queues.exceptions import InvalidQueueEngine
from spanner_queues.queues import queue_models

#: the package whose tests are the suite
SUITE = "spanner_queues.testing.conformance"
SUITE_DIR = Path(__file__).resolve().parent
OPTION = "--sq-conformance"
#: what a child process of a test reads: the test database's name, the engine alias under test
DATABASE_ENV = "SQ_DATABASE_NAME"
ENGINE_ENV = "SQ_CONFORMANCE_ENGINE"
_engine_alias: str | None = None

#: the tiers, by what a test needs
TIERS = {
    "unit": "no database: pytest-django refuses one to a test without django_db",
    "conformance": f"the engine conformance suite ({SUITE}): every verb on the engine under test",
    "integration": "a database and this process: the ORM, the worker in a thread, the admin",
    "e2e": "real processes: runqueueworker and other children, servers, a browser",
}
#: markers and fixtures that make a test end to end (real processes, a server, a browser)
E2E_MARKERS = ("process", "browser")
E2E_FIXTURES = frozenset({"child_env", "live_server"})
DB_FIXTURES = frozenset({"db", "transactional_db", "django_db_setup"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        metavar="ALIAS",
        default=None,
        help="run spanner_queues' engine conformance suite on the engine SPANNER_QUEUES[ALIAS] "
        "configures (needs spanner_queues.testing.conformance in INSTALLED_APPS)",
    )


def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    """With ``--sq-conformance``, collect the suite's package (as well as any path given)."""
    if any(a == OPTION or a.startswith(OPTION + "=") for a in args):
        args.append(str(SUITE_DIR))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "requires(*flags): run only where the engine under test has these EngineFeatures "
        "flags (e.g. 'supports_release'); skipped elsewhere, by the flags, never by name",
    )
    config.addinivalue_line(
        "markers", "unless(*flags): run only where the engine under test lacks these flags"
    )
    config.addinivalue_line(
        "markers",
        "engine_independent: the behaviour does not depend on the database or the queue engine "
        "(documentation, argument and declaration checks that never reach a database); "
        "spanner_queues' own runs keep it under tests.settings only (tests/conftest.py)",
    )
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: test tier: {what}")
    global _engine_alias
    alias = config.getoption(OPTION)
    if alias and alias != "default":
        make_default(alias)
        _engine_alias = alias


def pytest_report_header(config: pytest.Config) -> str | None:
    """With ``--sq-conformance``: the alias and the engine class the suite runs on."""
    alias = config.getoption(OPTION)
    if not alias:
        return None
    engine = type(engines["default"])
    return f"spanner_queues conformance: {alias} = {engine.__module__}.{engine.__qualname__}"


def make_default(alias: str) -> None:
    """Let ``SPANNER_QUEUES[alias]`` be the run's ``default`` engine."""
    configured = dict(getattr(settings, "SPANNER_QUEUES", None) or DEFAULT_SETTING)
    if alias not in configured:
        raise InvalidQueueEngine(f"{OPTION}={alias}: no such alias in SPANNER_QUEUES.")
    configured["default"] = configured[alias]
    settings.SPANNER_QUEUES = configured
    # as override_settings does: engines made from the old setting are dropped
    setting_changed.send(
        sender=type(settings), setting="SPANNER_QUEUES", value=configured, enter=True
    )


@pytest.fixture
def child_env(transactional_db: None) -> dict[str, str]:
    """Environment for a child process that must use this test's database and the engine under
    test (``spanner_queues.testing.conformance.claimer`` reads them)."""
    env = dict(os.environ)
    env[DATABASE_ENV] = str(connection.settings_dict["NAME"])
    env["DJANGO_SETTINGS_MODULE"] = os.environ.get(
        "DJANGO_SETTINGS_MODULE", str(settings.SETTINGS_MODULE)
    )
    if _engine_alias:
        env[ENGINE_ENV] = _engine_alias
    return env


def in_suite(item: pytest.Item) -> bool:
    """Whether ``item`` is a test of the conformance suite."""
    module = getattr(item, "module", None)
    return module is not None and module.__name__.startswith(SUITE + ".")


def tier_of(item: pytest.Item) -> str:
    """``conformance`` for the suite's tests; ``e2e`` for a test marked ``process`` or
    ``browser`` or starting processes or a server (``child_env``, ``live_server``); ``unit`` for
    a test that has no database; ``integration`` otherwise. A test's own tier marker wins."""
    own = [tier for tier in TIERS if item.get_closest_marker(tier)]
    if own:
        return own[0]
    if in_suite(item):
        return "conformance"
    fixtures = set(getattr(item, "fixturenames", ()))
    if any(item.get_closest_marker(m) for m in E2E_MARKERS) or E2E_FIXTURES & fixtures:
        return "e2e"
    if item.get_closest_marker("django_db") is None and not DB_FIXTURES & fixtures:
        return "unit"
    return "integration"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(tier_of(item))


def pytest_runtest_setup(item: pytest.Item) -> None:
    requires = [flag for mark in item.iter_markers("requires") for flag in mark.args]
    unless = [flag for mark in item.iter_markers("unless") for flag in mark.args]
    if not requires and not unless:
        return
    engine = engines["default"]
    for flag in requires:
        if not getattr(engine.features, flag):
            pytest.skip(f"the {type(engine).__name__} engine has no {flag}")
    for flag in unless:
        if getattr(engine.features, flag):
            pytest.skip(f"for engines without {flag}")


@pytest.fixture(autouse=True)
def _conformance_queues_emptied(request: pytest.FixtureRequest) -> Iterator[None]:
    """A committing test of the suite ends with no RECEIVE stream running and every queue empty
    where the engine keeps native queues (Django's flush empties tables only)."""
    yield
    if not in_suite(request.node) or not uses_transactional_db(request):
        return
    if engines["default"].features.supports_native_queues:
        empty_native_queues(request)


def uses_transactional_db(request: pytest.FixtureRequest) -> bool:
    """Whether the test commits (a transactional ``django_db`` mark or fixture)."""
    marker = request.node.get_closest_marker("django_db")
    if marker is not None and (
        marker.kwargs.get("transaction") or (marker.args and marker.args[0])
    ):
        return True
    return bool({"transactional_db", "live_server", "child_env"} & set(request.fixturenames))


def empty_native_queues(request: pytest.FixtureRequest, alias: str = "default") -> None:
    """End a test with no RECEIVE stream running and every queue empty. For an engine that keeps
    native queues (Django's flush after a transactional test empties tables, not queues); it
    needs the engine's ``purge(model)`` and ``declaration(model).name`` (the queue's name in
    SQL), as the native engine has."""
    engine = engines[alias]
    engine.stop_receiving(wait=10)
    blocker = request.getfixturevalue("django_db_blocker")
    with blocker.unblock():
        held = _queues_holding_messages(engine, list(queue_models()))  # one read
        with transaction.atomic(using=engine.database):  # one commit for every queue
            for model in held:
                engine.purge(model)


def _queues_holding_messages(engine: Any, models: list[Any]) -> list[Any]:
    """The queues among ``models`` that hold any message (leased or not), in one read."""
    db = connections[engine.database]
    names = [db.ops.quote_name(engine.declaration(m).name) for m in models]
    sql = " UNION ALL ".join(f"SELECT {i}, COUNT(*) FROM {n}" for i, n in enumerate(names))
    with db.cursor() as cursor:
        cursor.execute(sql)
        return [models[i] for i, count in cursor.fetchall() if count]

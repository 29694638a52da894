from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from django.db import connection

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 20.0, interval: float = 0.02) -> T:
    """Poll ``condition`` until it returns something truthy; fail the test on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(interval)


def receive_due(queue: Any, count: int = 1, timeout: float = 60.0, **kwargs: Any) -> list[Any]:
    """Receive until ``count`` messages that are due have arrived (a streaming engine may hand
    them over a moment after they are due, or, if a stream of an earlier test leased them as it
    was being cancelled, after that 10 s lease); fail the test on timeout. Returns at once in
    the usual case."""
    from spanner_queues import api

    got: list[Any] = []

    def enough() -> bool:
        got.extend(api.receive(queue, **kwargs))
        return len(got) >= count

    wait_until(enough, timeout=timeout)
    return got


@pytest.fixture
def wait() -> Callable[..., object]:
    return wait_until


@pytest.fixture
def child_env(transactional_db: None) -> dict[str, str]:
    """Environment for a child process that must use this test's database."""
    env = dict(os.environ)
    env["SQ_DATABASE_NAME"] = str(connection.settings_dict["NAME"])
    env["DJANGO_SETTINGS_MODULE"] = os.environ.get("DJANGO_SETTINGS_MODULE", "tests.settings")
    return env


def pytest_report_header(config: pytest.Config) -> str:
    from django.conf import settings

    db = settings.DATABASES["default"]
    where = os.environ.get("SPANNER_EMULATOR_HOST", "")
    return f"spanner_queues database: {db['ENGINE']} {where}".rstrip()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "requires(*flags): run only where the default queue engine has these EngineFeatures "
        "flags (e.g. 'supports_release'); skipped elsewhere, by the flags, never by name",
    )
    config.addinivalue_line(
        "markers", "unless(*flags): run only where the default queue engine lacks these flags"
    )
    config.addinivalue_line(
        "markers",
        "engine_independent: the behaviour does not depend on the database or the queue engine "
        "(documentation, argument and declaration checks that never reach a database): runs "
        "once, under tests.settings; deselected under every other settings module",
    )


#: The settings module whose run covers the ``engine_independent`` tests.
ENGINE_INDEPENDENT_SETTINGS = "tests.settings"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("DJANGO_SETTINGS_MODULE") == ENGINE_INDEPENDENT_SETTINGS:
        return
    once = [item for item in items if item.get_closest_marker("engine_independent")]
    if once:
        config.hook.pytest_deselected(items=once)
        items[:] = [item for item in items if not item.get_closest_marker("engine_independent")]


def pytest_runtest_setup(item: pytest.Item) -> None:
    requires = [flag for mark in item.iter_markers("requires") for flag in mark.args]
    unless = [flag for mark in item.iter_markers("unless") for flag in mark.args]
    if not requires and not unless:
        return
    from spanner_queues.engines import engines

    engine = engines["default"]
    for flag in requires:
        if not getattr(engine.features, flag):
            pytest.skip(f"the {type(engine).__name__} engine has no {flag}")
    for flag in unless:
        if getattr(engine.features, flag):
            pytest.skip(f"for engines without {flag}")


@pytest.fixture(autouse=True)
def _native_queues_emptied(request: pytest.FixtureRequest) -> Any:
    """On native queues (not tables: Django's flush leaves them alone) each test ends with no
    RECEIVE stream running and every queue empty."""
    yield
    if os.environ.get("DJANGO_SETTINGS_MODULE") != "tests.settings_spanner_native":
        return
    marker = request.node.get_closest_marker("django_db")
    transactional = marker is not None and (
        marker.kwargs.get("transaction") or (marker.args and marker.args[0])
    )
    if not transactional and not {"transactional_db", "live_server", "child_env"} & set(
        request.fixturenames
    ):
        return
    from spanner_queues.engines import engines
    from spanner_queues.registry import queue_models

    engine = engines["default"]
    engine.stop_receiving(wait=10)
    blocker = request.getfixturevalue("django_db_blocker")
    from django.db import transaction

    with blocker.unblock():
        held = _queues_holding_messages(engine, list(queue_models()))  # one read
        with transaction.atomic():  # one commit for every queue
            for model in held:
                engine.purge(model)


def _queues_holding_messages(engine: Any, models: list[Any]) -> list[Any]:
    """The queues among ``models`` that hold any message (leased or not), in one read."""
    from django.db import connections

    db = connections[engine.database]
    names = [db.ops.quote_name(engine.declaration(m).name) for m in models]
    sql = " UNION ALL ".join(f"SELECT {i}, COUNT(*) FROM {n}" for i, n in enumerate(names))
    with db.cursor() as cursor:
        cursor.execute(sql)
        return [models[i] for i, count in cursor.fetchall() if count]


# --- a quicker flush between transactional tests on Spanner --------------------------------
# Django flushes every table after each transactional test, then re-creates every content type
# and permission through post_migrate: about 40 autocommit statements, 2-3 s a test on the
# emulator. On Spanner this flush leaves the database in the same state with one read: it empties
# only the tables that hold rows, and keeps the content types and permissions that migrate
# created, which it checks are unchanged (if a test changed them, Django's own flush runs).
# Only on the emulator.
_KEPT_BY_MIGRATE = ("django_content_type", "auth_permission")


class _SpannerFlush:
    """The emptying of one Spanner test database after a transactional test."""

    def __init__(self, alias: str) -> None:
        from django.db import connections

        self.connection = connections[alias]
        introspection = self.connection.introspection
        self.tables = sorted(introspection.django_table_names(only_existing=True))
        quote = self.connection.ops.quote_name
        parts = []
        for table in self.tables:
            newest = "MAX(id)" if table in _KEPT_BY_MIGRATE else "CAST(NULL AS INT64)"
            parts.append(f"SELECT '{table}', COUNT(*), {newest} FROM {quote(table)}")
        self.census_sql = " UNION ALL ".join(parts)
        self.kept = {t: n for t, n in self.census().items() if t in _KEPT_BY_MIGRATE}

    def census(self) -> dict[str, tuple[int, int | None]]:
        """(row count, greatest id) of each table, in one read."""
        with self.connection.cursor() as cursor:
            cursor.execute(self.census_sql)
            return {table: (count, newest) for table, count, newest in cursor.fetchall()}

    def flush(self) -> None:
        """Empty every table but the kept ones; if those changed, Django's flush (with
        post_migrate) instead."""
        from django.core.management import call_command
        from django.core.management.color import no_style

        census = self.census()
        if any(census[t] != rows for t, rows in self.kept.items()):
            call_command("flush", verbosity=0, interactive=False, database=self.connection.alias)
            self.kept = {t: n for t, n in self.census().items() if t in _KEPT_BY_MIGRATE}
            return
        full = [t for t, (count, _) in census.items() if count and t not in self.kept]
        if full:
            ops = self.connection.ops
            ops.execute_sql_flush(ops.sql_flush(no_style(), full))


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Any:
    """pytest-django's test databases; on the emulator, transactional tests then end with
    ``_SpannerFlush`` instead of Django's flush."""
    from django.db import connections
    from django.test import TransactionTestCase

    spanner = [a for a in connections if connections[a].vendor == "spanner"]
    if not (spanner and os.environ.get("SPANNER_EMULATOR_HOST")):  # not the wire tests' fake
        yield
        return
    with django_db_blocker.unblock():
        flushes = {alias: _SpannerFlush(alias) for alias in spanner}
    original = TransactionTestCase._fixture_teardown

    def teardown(self: TransactionTestCase) -> None:
        names = self._databases_names(include_mirrors=False)
        if self.available_apps is not None or self.serialized_rollback:
            return original(self)
        if not set(names) <= set(flushes):
            return original(self)
        for alias in names:
            flushes[alias].flush()
        return None

    mp = pytest.MonkeyPatch()
    mp.setattr(TransactionTestCase, "_fixture_teardown", teardown)
    yield
    mp.undo()

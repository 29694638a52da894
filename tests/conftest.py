from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from spanner_queues.testing.conformance.plugin import empty_native_queues, uses_transactional_db
from spanner_queues.testing.conformance.support import receive_due, wait_until

#: the conformance suite's plugin: the ``requires``/``unless`` gates and the test tiers
#: (``unit``, ``conformance``, ``integration``, ``e2e``) for every test here too
pytest_plugins = ["spanner_queues.testing.conformance.plugin"]
__all__ = ["receive_due", "wait_until"]


@pytest.fixture
def wait() -> Callable[..., object]:
    return wait_until


def pytest_report_header(config: pytest.Config) -> str:
    from django.conf import settings

    db = settings.DATABASES["default"]
    where = os.environ.get("SPANNER_EMULATOR_HOST", "")
    return f"spanner_queues database: {db['ENGINE']} {where}".rstrip()


#: Tiers by directory or file, where a test's markers and fixtures do not tell (the plugin's
#: ``tier_of`` decides the rest): what starts real processes.
TIER_BY_PATH = {
    "tests/process/": "e2e",
    "tests/emulator/test_front_process.py": "e2e",
}


def pytest_itemcollected(item: pytest.Item) -> None:
    path = item.nodeid.split("::", 1)[0]
    for prefix, tier in TIER_BY_PATH.items():
        if path.startswith(prefix):
            item.add_marker(tier)


#: The settings module whose run covers the ``engine_independent`` tests.
ENGINE_INDEPENDENT_SETTINGS = "tests.settings"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("DJANGO_SETTINGS_MODULE") != ENGINE_INDEPENDENT_SETTINGS:
        once = [item for item in items if item.get_closest_marker("engine_independent")]
        if once:
            config.hook.pytest_deselected(items=once)
            items[:] = [i for i in items if not i.get_closest_marker("engine_independent")]
    _keep_shard(config, items)


def _keep_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``SQ_SHARD=k/n`` (bin/test): keep the k-th of n shares of the tests (1-based), so n
    processes, each with its own database server, together run the selection once. With
    ``SQ_DURATIONS`` naming a file of measured durations (``SQ_DURATIONS_OUT`` of an earlier
    run, merged: bin/test keeps it), the shares are cut by time (``shares_by_duration``);
    without it, by count (every n-th test from the k-th)."""
    shard = os.environ.get("SQ_SHARD")
    if not shard:
        return
    k, n = (int(part) for part in shard.split("/"))
    if not 1 <= k <= n:
        raise pytest.UsageError(f"SQ_SHARD={shard!r}: expected k/n with 1 <= k <= n")
    durations = _read_durations(os.environ.get("SQ_DURATIONS", ""))
    if durations:
        owner = shares_by_duration([item.nodeid for item in items], durations, n)
    else:
        owner = [i % n for i in range(len(items))]
    others = [item for i, item in enumerate(items) if owner[i] != k - 1]
    if others:
        config.hook.pytest_deselected(items=others)
        items[:] = [item for i, item in enumerate(items) if owner[i] == k - 1]


def _read_durations(path: str) -> dict[str, float]:
    if not path or not os.path.isfile(path):
        return {}
    with open(path) as f:
        return {str(k): float(v) for k, v in json.load(f).items()}


def shares_by_duration(nodeids: list[str], durations: dict[str, float], n: int) -> list[int]:
    """The share (0 to n-1) of each test: the longest first, each to the share with the least
    time so far (ties: the lower share); a test with no measure counts the median. The same
    list and durations give every shard the same answer."""
    known = sorted(durations[t] for t in nodeids if t in durations)
    median = known[len(known) // 2] if known else 1.0
    cost = [durations.get(t, median) for t in nodeids]
    loads = [0.0] * n
    owner = [0] * len(nodeids)
    for i in sorted(range(len(nodeids)), key=lambda i: (-cost[i], i)):
        share = min(range(n), key=lambda s: (loads[s], s))
        owner[i] = share
        loads[share] += cost[i]
    return owner


class DurationsOut:
    """``SQ_DURATIONS_OUT``: each test's setup, call and teardown seconds, summed, written at
    the end of the run. A plugin registered on the run (``pytest_configure``), not hooks of
    this conftest: pytest calls a conftest's ``pytest_runtest_logreport`` only for the tests
    under its directory, and the conformance suite's (``spanner_queues/testing/conformance``,
    about 7 s each on native queues) went unmeasured, counted at the median when cut by time."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.measured: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.measured[report.nodeid] = self.measured.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.measured:
            with open(self.out, "w") as f:
                measured = {k: round(v, 3) for k, v in sorted(self.measured.items())}
                json.dump(measured, f, indent=0)


def pytest_configure(config: pytest.Config) -> None:
    out = os.environ.get("SQ_DURATIONS_OUT")
    if out:
        config.pluginmanager.register(DurationsOut(out), "sq_durations_out")
    config.pluginmanager.register(QuickFlushPlugin(), "sq_quick_flush")


@pytest.fixture(autouse=True)
def _native_queues_emptied(request: pytest.FixtureRequest) -> Any:
    """On native queues (not tables: Django's flush leaves them alone) each test ends with no
    RECEIVE stream running and every queue empty."""
    yield
    native = ("tests.settings_spanner_native", "tests.settings_pubsub_native")
    if os.environ.get("DJANGO_SETTINGS_MODULE") not in native:
        return
    if uses_transactional_db(request):
        empty_native_queues(request)


# --- a quicker flush between transactional tests -------------------------------------------
# Django flushes every table after each transactional test, then re-creates every content type
# and permission through post_migrate: about 40 autocommit statements, 2-3 s a test on the
# emulator, 0.07 s (median) on SQLite, where 404 transactional tests spent 45 s in it. This
# flush leaves the database in the same state with one read: it empties only the tables that
# hold rows, and keeps the content types and permissions that migrate created, which it checks
# are unchanged (if a test changed them, Django's own flush runs). On every database but a real
# Spanner instance (tests.settings_real_spanner keeps Django's flush).
_KEPT_BY_MIGRATE = ("django_content_type", "auth_permission")


class _QuickFlush:
    """The emptying of one test database after a transactional test."""

    def __init__(self, alias: str) -> None:
        from django.db import connections

        self.connection = connections[alias]
        introspection = self.connection.introspection
        self.tables = sorted(introspection.django_table_names(only_existing=True))
        quote = self.connection.ops.quote_name
        no_id = f"CAST(NULL AS {self.connection.data_types['BigIntegerField']})"
        parts = []
        for table in self.tables:
            newest = "MAX(id)" if table in _KEPT_BY_MIGRATE else no_id
            parts.append(f"SELECT '{table}', COUNT(*), {newest} FROM {quote(table)}")
        self.census_sql = " UNION ALL ".join(parts)
        self.kept = {t: n for t, n in self.census().items() if t in _KEPT_BY_MIGRATE}
        # PostgreSQL: DELETE, not Django's TRUNCATE, which makes new files for every table
        # (60 ms a flush where DELETE of the few rows a test left takes a few; Django's foreign
        # keys are deferred to the commit, so the order of the tables does not matter)
        self.delete = self.connection.vendor == "postgresql"

    def census(self) -> dict[str, tuple[int, int | None]]:
        """(row count, greatest id) of each table, in one read."""
        with self.connection.cursor() as cursor:
            cursor.execute(self.census_sql)
            return {table: (count, newest) for table, count, newest in cursor.fetchall()}

    def flush(self) -> None:
        """Empty every table but the kept ones; if those changed, Django's flush (with
        post_migrate) instead. Run again when it loses a race: on the emulator, one read-write
        transaction at a time, a worker process's last transaction can still be open."""
        from django.core.management import call_command

        from spanner_queues.transactions import lost_race

        for attempt in range(50):
            try:
                emptied = self._empty()  # (Spanner's flush: a DELETE a table, autocommit)
                break
            except Exception as exc:
                if attempt == 49 or not lost_race(exc, self.connection.alias):
                    raise
                time.sleep(0.05)
        if emptied:
            return

        call_command("flush", verbosity=0, interactive=False, database=self.connection.alias)
        self.kept = {t: n for t, n in self.census().items() if t in _KEPT_BY_MIGRATE}

    def _empty(self) -> bool:
        """Empty the tables that hold rows; False, emptying nothing, if a kept one changed."""
        from django.core.management.color import no_style

        census = self.census()
        if any(census[t] != rows for t, rows in self.kept.items()):
            return False
        full = [t for t, (count, _) in census.items() if count and t not in self.kept]
        if full:
            ops = self.connection.ops
            if self.delete:
                ops.execute_sql_flush([f"DELETE FROM {ops.quote_name(t)}" for t in full])
            else:
                ops.execute_sql_flush(ops.sql_flush(no_style(), full))
        return True


class QuickFlushPlugin:
    """The ``django_db_setup`` override that installs ``_QuickFlush``: a plugin registered on
    the run (``pytest_configure``), not a fixture of this conftest, which only the tests under
    ``tests/`` would see: a run that starts with the conformance suite (the other lines' stages)
    gave it Django's flush until the first test of ``tests/`` (6-7 s a test on the emulator)."""

    @pytest.fixture(scope="session")
    def django_db_setup(self, django_db_setup: None, django_db_blocker: Any) -> Any:
        """pytest-django's test databases; transactional tests then end with ``_QuickFlush``
        instead of Django's flush (on a real Spanner instance, Django's flush)."""
        from django.db import connections
        from django.test import TransactionTestCase

        quick = [
            alias
            for alias in connections
            if connections[alias].vendor != "spanner" or os.environ.get("SPANNER_EMULATOR_HOST")
        ]
        if not quick:
            yield
            return
        with django_db_blocker.unblock():
            flushes = {alias: _QuickFlush(alias) for alias in quick}
        original = TransactionTestCase._fixture_teardown

        def teardown(case: TransactionTestCase) -> None:
            names = case._databases_names(include_mirrors=False)
            if case.available_apps is not None or case.serialized_rollback:
                return original(case)
            if not set(names) <= set(flushes):
                return original(case)
            for alias in names:
                flushes[alias].flush()
            return None

        mp = pytest.MonkeyPatch()
        mp.setattr(TransactionTestCase, "_fixture_teardown", teardown)
        yield
        mp.undo()

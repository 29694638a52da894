"""The quick flush after a transactional test (``_QuickFlush``, ``tests/conftest.py``) serves the
conformance suite's tests too, in a run that starts with them (the other lines' stages:
``spanner_queues/testing/conformance tests/test_spanner_extra.py``), where they got Django's
flush: 6-7 s a test on the emulator, two thirds of the native line's 650 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine_independent  # a child pytest run on SQLite

ROOT = Path(__file__).resolve().parent.parent

#: a plugin of the child run: the teardown each test's run would use, by test id
WATCH = """
import json, os
import pytest

seen = {}

@pytest.hookimpl(trylast=True)
def pytest_runtest_call(item):
    from django.test import TransactionTestCase
    seen[item.nodeid] = TransactionTestCase._fixture_teardown.__qualname__

def pytest_sessionfinish(session):
    with open(os.environ["SQ_FLUSH_WATCH"], "w") as f:
        json.dump(seen, f)
"""


def test_a_run_that_starts_with_the_conformance_suite_flushes_quickly(tmp_path: Path) -> None:
    (tmp_path / "flush_watch.py").write_text(WATCH)
    out = tmp_path / "seen.json"
    suite = "spanner_queues/testing/conformance/test_stats.py::test_stats_add_up"
    ours = "tests/test_shards_by_duration.py::test_one_long_test_gets_a_share_of_its_own"
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "SQ_FLUSH_WATCH": str(out),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
    }
    for name in ("SQ_SHARD", "SQ_DURATIONS_OUT"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "flush_watch", suite, ours],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(out.read_text())
    assert seen[suite] == "QuickFlushPlugin.django_db_setup.<locals>.teardown", seen

"""``SQ_SHARD`` with measured durations (``tests/conftest.py``): the shares are cut by time,
not by count (the four native shards took 411 to 650 s, cut by count)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import shares_by_duration

pytestmark = pytest.mark.engine_independent  # arithmetic on test ids

ROOT = Path(__file__).resolve().parent.parent


def test_one_long_test_gets_a_share_of_its_own() -> None:
    ids = [f"t{i}" for i in range(11)]
    durations = {"t0": 100.0, **{f"t{i}": 10.0 for i in range(1, 11)}}
    owner = shares_by_duration(ids, durations, 2)
    assert [ids[i] for i, s in enumerate(owner) if s == 0] == ["t0"]
    loads = [sum(durations[t] for t, s in zip(ids, owner, strict=True) if s == k) for k in (0, 1)]
    assert loads == [100.0, 100.0]  # by count: 150 and 50


def test_every_test_in_exactly_one_share_and_unmeasured_ones_count_the_median() -> None:
    ids = [f"t{i}" for i in range(40)]
    durations = {f"t{i}": float(i % 7 + 1) for i in range(0, 40, 2)}  # half measured
    owner = shares_by_duration(ids, durations, 4)
    assert len(owner) == len(ids) and set(owner) == {0, 1, 2, 3}
    assert owner == shares_by_duration(ids, durations, 4)  # every shard computes the same
    median = sorted(durations.values())[len(durations) // 2]
    cost = [durations.get(t, median) for t in ids]
    loads = [sum(c for c, s in zip(cost, owner, strict=True) if s == k) for k in range(4)]
    assert max(loads) - min(loads) <= max(cost)


def test_the_measured_durations_include_the_conformance_suites_tests(tmp_path: Path) -> None:
    """``SQ_DURATIONS_OUT`` measures every test of the run: the suite's too (a conftest's
    report hook sees only the tests under its directory; the suite's went unmeasured)."""
    out = tmp_path / "durations.json"
    suite = "spanner_queues/testing/conformance/test_stats.py::test_stats_add_up"
    ours = "tests/test_shards_by_duration.py::test_one_long_test_gets_a_share_of_its_own"
    env = {**os.environ, "SQ_DURATIONS_OUT": str(out), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    env.pop("SQ_SHARD", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", suite, ours],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    measured = json.loads(out.read_text())
    assert sorted(measured) == sorted([suite, ours])
    assert all(seconds > 0 for seconds in measured.values())


@pytest.mark.parametrize("stage", ["native", "table"])
def test_the_committed_durations_name_test_files_that_exist(stage: str) -> None:
    """``tests/durations/<stage>.json`` cut a clean clone's shards by time (``bin/test``, when
    the run has no durations of its own): seconds by test id, each id in a file of the tree
    (a stale id is ignored by the cut; a test the file lacks counts the median)."""
    durations = json.loads((ROOT / "tests" / "durations" / f"{stage}.json").read_text())
    assert len(durations) > 500
    assert all(isinstance(s, float | int) and s >= 0 for s in durations.values())
    files = {test_id.split("::", 1)[0] for test_id in durations}
    assert [f for f in files if not (ROOT / f).is_file()] == []
    assert any(f.startswith("spanner_queues/testing/conformance/") for f in files)

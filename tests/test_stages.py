"""``bin/test``'s stage runner (``bin/_stages.sh``), run with tiny stages: each stage's start and
end are printed when they happen (a stage sees the end line of the one before it in the
runner's output), a failed stage's log tail is printed, and the logs stay where the runner
said they are."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine_independent  # a shell script, no database


def _run_stages(tmp_path: Path, body: str) -> tuple[int, str]:
    out = tmp_path / "out.txt"
    script = (
        "set -euo pipefail\n"
        f"source {ROOT / 'bin' / '_stages.sh'}\n"
        "JOBS=2\n"
        f"stages_init {tmp_path / 'logs'}\n"
        f"export OUT={out}\n" + body + "\nif stages_report; then exit 0; else exit 1; fi\n"
    )
    with out.open("w") as sink:
        done = subprocess.run(["bash", "-c", script], stdout=sink, stderr=subprocess.STDOUT)
    return done.returncode, out.read_text()


def test_each_stage_prints_its_start_and_end_as_they_happen(tmp_path: Path) -> None:
    """Two stages of two shares each on two: the second starts after the first ended, and
    finds the first's end line already printed (the runner printed nothing until every stage
    had ended)."""
    rc, out = _run_stages(
        tmp_path,
        'parallel 2 "stage one" echo one\n'
        'parallel 2 "stage two" bash -c \'grep -q "passed (.*): stage one$" "$OUT"\'\n',
    )
    assert rc == 0, out
    lines = [line for line in out.splitlines() if re.match(r"== \d", line)]
    clock = r"\d\d:\d\d:\d\d"
    assert re.fullmatch(rf"== {clock} start: stage one \(log: .*/00-stage-one\.log\)", lines[0])
    assert re.fullmatch(rf"== {clock} passed \(\d+ s\): stage one", lines[1])
    assert re.fullmatch(rf"== {clock} start: stage two \(log: .*/01-stage-two\.log\)", lines[2])
    assert re.fullmatch(rf"== {clock} passed \(\d+ s\): stage two", lines[3])


def test_a_failed_stage_prints_its_log_tail_and_the_logs_stay(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    rc, out = _run_stages(
        tmp_path,
        'parallel 1 "fine" echo all good\n'
        "parallel 1 \"broken [shard 1/2]\" bash -c 'seq 1 100; echo the cause; exit 3'\n",
    )
    assert rc == 1
    assert f"== the logs of this run: {logs}" in out.splitlines()[0]
    failed = out.split("FAILED (exit 3, ", 1)[1]
    log = logs / "01-broken-shard-1-2.log"
    assert f"== the last 60 lines of {log}:\n" in failed
    tail = failed.split(f"{log}:\n", 1)[1].split("== (end of", 1)[0].splitlines()
    assert tail == [*map(str, range(42, 101)), "the cause"]
    assert f"FAILED (exit 3) broken [shard 1/2]: {log}" in out
    assert "passed          fine" in out
    # kept after the run
    assert log.read_text().endswith("100\nthe cause\n")
    assert (logs / "00-fine.log").read_text() == "all good\n"


def test_bin_test_keeps_its_logs_where_it_says() -> None:
    """bin/test runs its stages through the runner, into .test-logs/ (gitignored) or
    SQ_TEST_LOGS; .ci/run still calls it as it is."""
    script = (ROOT / "bin" / "test").read_text()
    assert 'source "$(dirname "$0")/_stages.sh"' in script
    assert 'stages_init "${SQ_TEST_LOGS:-$ROOT/.test-logs}"' in script
    assert "rm -rf" not in script
    assert ".test-logs/" in (ROOT / ".gitignore").read_text().splitlines()
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("exec bin/test")

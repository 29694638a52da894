"""``bin/test-real-spanner``, the real-instance run: skipped, saying so, without
``SPANNER_PROJECT``/``SPANNER_INSTANCE``/``SPANNER_DATABASE``; with them it runs the named
suites (which must exist) and the native benchmark, or says the benchmark is absent. The run
itself needs a real instance; these tests check the script and its settings module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine_independent

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bin" / "test-real-spanner"
VARIABLES = ("SPANNER_PROJECT", "SPANNER_INSTANCE", "SPANNER_DATABASE")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env.pop("SPANNER_EMULATOR_HOST", None)
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    return {**env, **extra}


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_without_the_variables_the_real_instance_run_is_skipped_saying_which() -> None:
    done = _run(env=_env(SPANNER_PROJECT="p"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "SKIPPED: real Spanner not configured: SPANNER_INSTANCE SPANNER_DATABASE not set."
    )
    assert "pytest" not in done.stdout


def test_the_run_names_suites_that_exist_and_the_benchmark_or_its_absence() -> None:
    done = _run("--dry-run", "-x", env=_env(**dict.fromkeys(VARIABLES, "x")))
    assert done.returncode == 0, done.stderr
    [pytest_line] = [line for line in done.stdout.splitlines() if line.startswith("+ pytest")]
    args = pytest_line.split()[2:]
    assert args[0] == "--ds=tests.settings_real_spanner" and args[-1] == "-x"
    paths = args[1:-1]
    assert {"spanner_queues/testing/conformance", "tests/worker", "tests/drill"} <= set(paths)
    assert all((ROOT / p).exists() for p in paths), paths
    if (ROOT / "benchmarks" / "native_round_trips.py").exists():
        assert "+ python benchmarks/native_round_trips.py" in done.stdout
    else:
        assert "SKIPPED: benchmarks/native_round_trips.py not found" in done.stdout


def test_a_missing_credentials_file_stops_the_run() -> None:
    env = _env(**dict.fromkeys(VARIABLES, "x"), GOOGLE_APPLICATION_CREDENTIALS="/nonexistent")
    done = _run("--dry-run", env=env)
    assert done.returncode == 2
    assert "no such file" in done.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"SPANNER_PROJECT": "p"}, "needs SPANNER_INSTANCE, SPANNER_DATABASE"),
        (
            {**dict.fromkeys(VARIABLES, "x"), "SPANNER_EMULATOR_HOST": "127.0.0.1:9"},
            "SPANNER_EMULATOR_HOST is set",
        ),
    ],
)
def test_the_real_instance_settings_refuse_what_would_not_reach_the_instance(
    extra: dict[str, str], message: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import tests.settings_real_spanner"],
        env=_env(**extra),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert message in done.stderr


def test_the_run_ends_with_the_probe_of_the_instance() -> None:
    done = _run("--dry-run", env=_env(**dict.fromkeys(VARIABLES, "x")))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        "+ python -m django spannerprobe --report spannerprobe.json"
    )

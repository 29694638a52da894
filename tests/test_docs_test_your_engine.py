"""``docs/howto/test-your-engine.md`` runs as shown: its engine of one's own and its settings
module, then its one command, which runs the shipped conformance suite on that alias."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "howto" / "test-your-engine.md"
SUITE = ROOT / "spanner_queues" / "testing" / "conformance"
_BLOCK = re.compile(r"^```(python|sh)\n(.*?)^```", re.S | re.M)

pytestmark = pytest.mark.engine_independent  # a project of its own, on its own database


def _blocks() -> tuple[dict[str, str], str]:
    files: dict[str, str] = {}
    commands = []
    for lang, code in _BLOCK.findall(PAGE.read_text()):
        if lang == "sh":
            commands.append(code.strip())
            continue
        header = re.match(r"# (\S+\.py)\n", code)
        assert header, f"a block of the page does not name its file:\n{code}"
        files[header.group(1)] = code
    [command] = commands
    return files, command


def test_the_page_names_every_module_of_the_suite() -> None:
    text = PAGE.read_text()
    modules = sorted(p.name for p in SUITE.glob("test_*.py"))
    assert modules and [m for m in modules if f"`{m}`" not in text] == []


@pytest.mark.slow
@pytest.mark.process
def test_the_page_runs_the_suite_on_an_engine_of_ones_own(tmp_path: Path) -> None:
    files, command = _blocks()
    assert set(files) == {"myengines.py", "conformance_settings.py"}
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    args = shlex.split(command)
    assert args[:3] == ["python", "-m", "pytest"] and "--sq-conformance=mine" in args
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SQ_", "PYTEST"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(tmp_path)])  # this checkout
    done = subprocess.run(
        [sys.executable, *args[1:], "-p", "no:cacheprovider", "-rs"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    passed = re.search(r"\b(\d+) passed\b", output)
    assert passed and int(passed.group(1)) >= 60 and "failed" not in output, output
    # the alias was the run's engine
    assert "spanner_queues conformance: mine = myengines.MyEngine" in output, output
    skips = re.findall(r"the (\w+) engine has no", output)
    assert skips == [] or set(skips) == {"MyEngine"}, output

"""The release metadata: one version source, an SPDX license expression with its file, the
release check wired into bin/test, and the README's install line the check runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import spanner_queues

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine_independent  # files of the repository, no database


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_written_once_in_the_package() -> None:
    data = _project()
    assert "version" not in data["project"]
    assert "version" in data["project"]["dynamic"]
    attr = data["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "spanner_queues.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", spanner_queues.__version__)


def test_the_license_is_an_spdx_expression_with_its_file() -> None:
    project = _project()["project"]
    assert project["license"] == "Apache-2.0"  # a string: the TOML table form is deprecated
    for name in project["license-files"]:
        assert "Apache License" in (ROOT / name).read_text()
    requires = _project()["build-system"]["requires"]
    assert any(re.fullmatch(r"setuptools>=(7[7-9]|[89]\d)(\.\d+)*", r) for r in requires)


def test_bin_test_runs_the_release_check_and_the_check_fails_on_deprecations() -> None:
    assert '"$(dirname "$0")/_release_check.sh"' in (ROOT / "bin" / "test").read_text()
    check = (ROOT / "bin" / "_release_check.sh").read_text()
    assert 'grep -i -n "deprecat" "$WORK/build.log"' in check
    assert "python -m spanner_queues_emulator --help" in check.replace('"$VPY"', "python")


def test_the_readme_install_line_is_the_one_the_check_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    lines = [
        line
        for line in readme.splitlines()
        if line.startswith("python -m pip install --find-links dist ")
    ]
    assert lines == ['python -m pip install --find-links dist "spanner-queues[metrics]"']
    assert "metrics" in _project()["project"]["optional-dependencies"]

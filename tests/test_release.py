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
        if line.startswith("python -m pip install --find-links ~/wheels ")
    ]
    assert lines == [
        'python -m pip install --find-links ~/wheels "spanner-queues[metrics]"',
        'python -m pip install --find-links ~/wheels "spanner-queues[spanner,metrics]"',
    ]
    # a wheelhouse at an absolute path: the line works from any directory (a relative
    # `--find-links dist` worked only in the checkout)
    assert "python -m build --outdir ~/wheels /path/to/spanner_queues" in readme
    assert "metrics" in _project()["project"]["optional-dependencies"]
    check = (ROOT / "bin" / "_release_check.sh").read_text()
    assert "grep -m1 -E '^python -m pip install --find-links ~/wheels '" in check


#: the supported lines (docs/index.md#supported-versions): Django -> the Pythons it runs on
LINES = {"5.2": ("3.10", "3.11", "3.12", "3.13"), "6.0": ("3.12", "3.13"), "6.1": ("3.12", "3.13")}


def test_the_classifiers_and_the_pins_match_the_supported_lines() -> None:
    project = _project()["project"]
    classifiers = set(project["classifiers"])
    assert {c for c in classifiers if c.startswith("Framework :: Django ::")} == {
        f"Framework :: Django :: {v}" for v in LINES
    }
    pythons = {p for versions in LINES.values() for p in versions}
    assert {
        c for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    } == {f"Programming Language :: Python :: {v}" for v in pythons}
    assert project["requires-python"] == ">=3.10"
    assert "django>=5.2,<6.2" in project["dependencies"]
    # the Spanner driver is an extra: a project on SQLite or PostgreSQL installs none of it
    assert not [d for d in project["dependencies"] if "spanner" in d]
    extras = project["optional-dependencies"]
    assert {d.split(">")[0] for d in extras["spanner"]} == {
        "django-google-spanner",
        "google-cloud-spanner",
    }
    assert extras["postgres"] == ["psycopg[binary]>=3.1"]


def test_bin_test_runs_each_line_the_docs_name() -> None:
    script = (ROOT / "bin" / "test").read_text()
    assert '"django-6.0|3.12|django>=6.0,<6.1|test,spanner,postgres|' in script
    assert '"django-6.1|3.13|django>=6.1,<6.2|test,postgres|' in script
    index = (ROOT / "docs" / "index.md").read_text()
    for django, python in (("5.2", "3.11"), ("6.0", "3.12"), ("6.1", "3.13")):
        assert f"Django {django} with Python {python}" in index

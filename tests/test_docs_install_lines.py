"""Every page's install line of spanner_queues is the README's wheelhouse form, with extras the
package has: a newcomer pastes them into a project outside the checkout, where
``pip install spanner-queues`` finds nothing (the release is installed from the wheelhouse
``python -m build`` wrote, README "Install")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine_independent  # the pages, no database

#: the README's form: ``python -m pip install --find-links ~/wheels "spanner-queues[a,b]"``
WHEELHOUSE = re.compile(
    r'^python -m pip install --find-links ~/wheels "spanner-queues(?:\[(?P<extras>[a-z,-]+)\])?"'
)
_FENCED = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)
_SPAN = re.compile(r"`([^`]+)`")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _install_lines(text: str) -> list[str]:
    """The commands that install the package: a fenced block's lines and the inline code spans
    (joined across a line break) that start with ``pip install`` or ``python -m pip install``
    and name ``spanner-queues``; an error message quoted in a span starts otherwise."""
    lines = [line for block in _FENCED.findall(text) for line in block.splitlines()]
    outside = _FENCED.sub("", text)
    lines += [" ".join(span.split()) for span in _SPAN.findall(outside)]
    return [
        line.strip()
        for line in lines
        if re.match(r"\s*(python -m )?pip install\b", line) and "spanner-queues" in line
    ]


def test_every_install_line_of_the_package_uses_the_wheelhouse() -> None:
    section = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1]
    extras = set(re.findall(r"^([a-z-]+) = \[", section.split("\n[", 1)[0], re.M))
    assert {"spanner", "tasks", "pubsub", "tracing"} <= extras
    found: dict[str, list[str]] = {}
    wrong: list[str] = []
    for page in _pages():
        for line in _install_lines(page.read_text()):
            found.setdefault(page.name, []).append(line)
            match = WHEELHOUSE.match(line)
            named = set((match.group("extras") or "").split(",")) - {""} if match else set()
            if match is None or not named <= extras:
                wrong.append(f"{page.relative_to(ROOT)}: {line}")
    assert not wrong, "install lines not in the README's wheelhouse form:\n" + "\n".join(wrong)
    # the how-tos of the optional apps each have one (the walk finds them)
    assert {"tasks.md", "pubsub.md", "tracing.md", "metrics.md", "README.md"} <= set(found)


def test_the_readme_says_the_tasks_extra_is_for_django_5_2_only() -> None:
    """Django 6 has ``django.tasks``: the extra adds the backport, for Django 5.2."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    [offer] = re.findall(r"add `tasks` (.*?)`tracing`", readme)
    assert "Django 5.2" in offer and "django.tasks" in offer, offer

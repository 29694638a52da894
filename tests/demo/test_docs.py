"""The pattern pages quote demo_project: every quoted block must still be in its file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs" / "howto" / "patterns").glob("[0-9][0-9]-*.md"))
BLOCK = re.compile(r"```python\n# (demo_project/\S+)\n(.*?)```", re.S)


def test_there_is_a_page_per_pattern() -> None:
    assert len(PAGES) == 13


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_quoted_code_matches_the_demo(page: Path) -> None:
    blocks = BLOCK.findall(page.read_text())
    assert blocks, f"{page.name} quotes no demo code"
    for path, code in blocks:
        source = (ROOT / path).read_text()
        for chunk in code.strip().split("\n\n\n"):
            assert chunk.strip() in source, f"{page.name}: {path} no longer contains:\n{chunk}"

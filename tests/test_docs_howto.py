"""The how-to pages say what the code does: the defaults they name for ``runqueueworker`` are the
command's own, and the snippets of ``docs/howto/testing.md`` run as shown."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from spanner_queues.management.commands.runqueueworker import Command

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
pytestmark = pytest.mark.engine_independent  # the pages and the code, no database


def _argparse_defaults() -> dict[str, Any]:
    parser = Command().create_parser("manage.py", "runqueueworker")
    return {
        option: action.default
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--")
    }


def _is_number(text: str) -> bool:
    return re.fullmatch(r"\d+(\.\d+)?", text) is not None


def test_commands_reference_states_the_argparse_defaults() -> None:
    """Each option's "default" cell is the parser's default: a number where the parser has one,
    a word (adaptive, off, none, ...) where it has ``None``/``False``."""
    defaults = _argparse_defaults()
    text = (DOCS / "reference" / "commands.md").read_text()
    rows = re.findall(r"^\| `(--[a-z-]+)[^`]*` \| ([^|]+) \|", text, re.M)
    assert len(rows) >= 10
    for option, cell in rows:
        cell = cell.strip().strip("`")
        default = defaults[option]
        if default is None or default is False:
            assert not _is_number(cell), f"{option}: documented {cell!r}, the parser has none"
        elif isinstance(default, (int, float)):
            assert _is_number(cell) and float(cell) == default, (option, cell, default)
        else:
            assert cell == str(default), (option, cell, default)


#: "`--prefetch 1` (the default)", "`--batch-size 10` (default)" in running text
_NAMED_DEFAULT = re.compile(r"`(--[a-z-]+) ([^`]+)` \((?:the )?default\)")


def test_howto_pages_name_the_argparse_defaults() -> None:
    defaults = _argparse_defaults()
    for page in sorted((DOCS / "howto").rglob("*.md")):
        for option, value in _NAMED_DEFAULT.findall(page.read_text()):
            default = defaults[option]
            assert default is not None and str(default) == value, (
                f"{page.name}: `{option} {value}` is called the default; the command's is "
                f"{'adaptive/none' if default is None else default}"
            )

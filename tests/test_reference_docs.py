"""The reference pages stay in step with the code: every settings key, runqueueworker option,
check id and exception class the code has is documented, and the pages name nothing the code
does not have."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from django.core.management.base import BaseCommand

from spanner_queues import exceptions, receivers
from spanner_queues.conf import COMMON_OPTIONS
from spanner_queues.management.commands.runqueueworker import Command

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
pytestmark = pytest.mark.engine_independent  # the pages and the code, no database
BACKOFF_KEYS = {
    "INITIAL_SECONDS",
    "MULTIPLIER",
    "MAX_SECONDS",
    "HOURLY_AFTER_SECONDS",
    "HOURLY_SECONDS",
    "JITTER",
}


def _page(name: str) -> str:
    return (REFERENCE / name).read_text()


def _table_keys(text: str, heading: str) -> set[str]:
    """The first-column `KEY`s of the table under ``heading``."""
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    return set(re.findall(r"^\| `([A-Z_]+)` \|", section, re.M))


def test_settings_page_documents_exactly_the_options_the_code_accepts() -> None:
    from spanner_queues.conf import parse_engine

    text = _page("settings.md")
    assert _table_keys(text, "### `OPTIONS`\n") == set(COMMON_OPTIONS)
    assert _table_keys(text, '### `OPTIONS["BACKOFF"]`') == BACKOFF_KEYS
    # the BACKOFF keys the page lists are the ones parse_engine accepts
    parse_engine("x", {"OPTIONS": {"BACKOFF": dict.fromkeys(BACKOFF_KEYS, 1)}})


def test_commands_page_documents_exactly_the_runqueueworker_options() -> None:
    parser = Command().create_parser("manage.py", "runqueueworker")
    django_defaults = {
        "--version", "--settings", "--pythonpath", "--traceback", "--no-color",
        "--force-color", "--skip-checks", "--help", "--verbosity",
    }  # fmt: skip
    ours = {
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option not in django_defaults
    }
    text = _page("commands.md")
    documented = set(re.findall(r"^\| `(--[a-z-]+)", text, re.M))
    assert documented == ours
    synopsis = text.split("```", 2)[1]
    assert {o for o in ours if o not in synopsis} == set()


def test_runqueueworker_help_lists_each_of_its_options_in_a_group_of_its_concern() -> None:
    parser = Command().create_parser("manage.py", "runqueueworker")
    djangos = {action.dest for action in BaseCommand().create_parser("m", "x")._actions}
    ours = [
        group.title
        for group in parser._action_groups
        for action in group._group_actions
        if action.option_strings and action.dest not in djangos
    ]
    assert ours and "options" not in ours  # none left among Django's own options
    help_text = parser.format_help()
    for title in ("When to stop:", "Leases and time limits:", "Health probes (/livez, /readyz):"):
        assert title in help_text


def _check_ids_in_code() -> set[str]:
    ids = set()
    for path in (ROOT / "spanner_queues").rglob("*.py"):
        ids |= set(re.findall(r"spanner_queues\.([EW]\d{3})", path.read_text()))
    return ids


def test_checks_page_documents_exactly_the_check_ids_in_the_code() -> None:
    text = _page("checks.md")
    sections = set(re.findall(r"^## spanner_queues\.([EW]\d{3})$", text, re.M))
    table = set(re.findall(r"^\| \[([EW]\d{3})\]", text, re.M))
    assert sections == table == _check_ids_in_code()


def _exception_classes() -> set[str]:
    found = {
        name
        for name, cls in inspect.getmembers(exceptions, inspect.isclass)
        if issubclass(cls, exceptions.QueueError) and cls.__module__ == exceptions.__name__
    }
    # the two the receiver registry defines, documented on the same page
    for cls in (receivers.ReceiverConfigurationError, receivers.NoReceiver):
        assert issubclass(cls, exceptions.QueueError)
    return found


def test_exceptions_page_documents_every_exception_class() -> None:
    text = _page("exceptions.md")
    headings = set(re.findall(r"^## `(\w+)`$", text, re.M))
    assert headings == _exception_classes()
    tree = text.split("```text", 1)[1].split("```", 1)[0]
    in_tree = set(re.findall(r"── (?:receivers\.)?(\w+)", tree))
    assert in_tree == _exception_classes() | {"ReceiverConfigurationError", "NoReceiver"}

"""What docs/howto/migrations-and-deploys.md says of the stack holds: django-google-spanner runs
migrations outside transactions and its driver sends each DDL statement as a long-running
operation it waits for; the links of the page exist."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "howto" / "migrations-and-deploys.md"
pytestmark = pytest.mark.engine_independent  # the page and the installed drivers' code


def test_migrations_on_spanner_are_not_atomic() -> None:
    from django.db.utils import ConnectionHandler

    handler = ConnectionHandler(
        {
            "default": {"ENGINE": "django.db.backends.dummy"},
            "sp": {"ENGINE": "django_spanner", "INSTANCE": "i", "NAME": "d"},
        }
    )
    assert handler["sp"].features.can_rollback_ddl is False  # Django's migrate: no atomic()


def test_each_ddl_statement_is_an_operation_the_driver_waits_for() -> None:
    from google.cloud.spanner_dbapi import connection, cursor

    prior = inspect.getsource(connection).split("def run_prior_DDL_statements", 1)[1]
    assert "update_ddl(ddl_statements).result()" in prior.split("\n    def ", 1)[0]
    # in autocommit (no client transaction) a DDL statement runs at once
    source = inspect.getsource(cursor)
    assert re.search(
        r"_batch_DDLs\(sql\)\s+if not self\.connection\._client_transaction_started:\s+"
        r"self\.connection\.run_prior_DDL_statements\(\)",
        source,
    )


def test_the_pages_links_exist() -> None:
    text = PAGE.read_text()
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert (PAGE.parent / target).resolve().exists(), target

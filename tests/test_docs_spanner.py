"""The Spanner pages spell what the code sends and what Google documents."""

from __future__ import annotations

from pathlib import Path

import pytest

from spanner_queues.engines.spanner_ddl import GoogleSQL, KeyColumn, PostgreSQL, QueueDeclaration
from spanner_queues.options import RowDeletion

DOCS = Path(__file__).resolve().parents[1] / "docs" / "howto"
pytestmark = pytest.mark.engine_independent  # the pages and the SQL the dialects render
DECL = QueueDeclaration("q", (KeyColumn("k", "IntegerField"),))
#: Cloud Monitoring's queue metrics (spanner.googleapis.com/queue/...).
GOOGLE_QUEUE_METRICS = (
    "buffered_ready_messages",
    "message_send_count",
    "message_ack_count",
    "oldest_unacked_message_age",
    "lease_expiration_count",
)


def _call(sql: str) -> str:
    """The function call of a SELECT, with two lease tokens written as the docs write many."""
    return sql.split(" FROM ", 1)[1].replace("$2]", "$2, ...]").replace("@p1]", "@p1, ...]")


def test_spanner_page_spells_renewlease_and_receive_as_the_dialects_render_them() -> None:
    page = (DOCS / "spanner.md").read_text()
    assert _call(GoogleSQL().renew(DECL, 2)) in page  # RENEWLEASE_q(lease_tokens => [@p0, ...])
    assert _call(PostgreSQL().renew(DECL, 2)) in page  # ARRAY[$1, $2, ...]
    pg_receive = PostgreSQL().receive(DECL, max_batch_size=7, max_duration="9m")
    assert _call(pg_receive).replace("7", "n").replace("9m", "d") in page
    assert "@lease_tokens" not in page


def test_row_deletion_policy_is_documented_as_its_own_clause() -> None:
    page = (DOCS / "spanner.md").read_text()
    decl = QueueDeclaration("q", DECL.keys, row_deletion=RowDeletion(None, 7))
    clause = GoogleSQL().create_queue(decl).split("PRIMARY KEY (k)", 1)[1]
    assert clause.replace("7", "n") in page  # , ROW DELETION POLICY (OLDER_THAN(...))
    assert "`ROW DELETION POLICY`, `disable_send`" not in page  # no longer an OPTIONS key


def test_deployment_page_names_googles_five_queue_metrics() -> None:
    page = (DOCS / "deployment.md").read_text()
    section = page.split("## What to monitor", 1)[1].split("### The app's own counts", 1)[0]
    for metric in GOOGLE_QUEUE_METRICS:
        assert f"`{metric}`" in section
    assert "returns at most `max_batch_size`" not in page
    assert "never asks for more messages than there are free threads" not in page

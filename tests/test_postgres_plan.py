"""On PostgreSQL, a claim reaches due rows through the DeliverTime index and passes over rows
other claims hold (``FOR UPDATE SKIP LOCKED``), so its cost grows with the batch, not with the
depth of the queue, and N claimers do not queue on the head row."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from spanner_queues import api
from tests.testapp.models import UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_claim_query_is_an_index_range_scan_that_skips_locked_rows() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL query plans (EXPLAIN); SQLite's are in test_sqlite_plan.py")
    UserTasks.send_many(
        [{"user_id": n % 50, "message_id": str(n), "payload": {}} for n in range(5000)]
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {connection.ops.quote_name(UserTasks._meta.db_table)}")
    with CaptureQueriesContext(connection) as queries:
        assert len(api.receive(UserTasks, max_messages=10)) == 10
    claims = [q["sql"] for q in queries.captured_queries if "SKIP LOCKED" in q["sql"]]
    assert len(claims) == 1, queries.captured_queries  # the claim's read, as the engine ran it
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {claims[0]}")
        plan = "\n".join(str(row[0]) for row in cursor.fetchall())
    # Limit -> LockRows -> Index Scan using "testapp_usertasks_DeliverTime_..."
    #                        Index Cond: ("DeliverTime" <= ...)
    assert 'Index Scan using "testapp_usertasks_DeliverTime' in plan, plan
    assert 'Index Cond: ("DeliverTime" <=' in plan, plan
    assert "LockRows" in plan, plan
    assert "Seq Scan" not in plan, plan
    assert "Sort" not in plan, plan  # the index gives the order

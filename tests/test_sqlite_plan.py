"""On SQLite, a claim reaches due rows through the DeliverTime index, so its cost grows with the
batch, not with the depth of the queue (the emulator scans whole tables whatever we do)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from spanner_queues.storage import rows
from tests.testapp.models import UserTasks

pytestmark = pytest.mark.django_db


def test_claim_query_uses_the_deliver_time_index() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("query plans are checked on SQLite; the emulator always scans")
    qs = rows(UserTasks, "default").filter(deliver_time__lte=timezone.now())
    sql, params = qs.order_by("deliver_time")[:10].query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        plan = " ".join(str(row[-1]) for row in cursor.fetchall())
    assert "USING INDEX testapp_usertasks_DeliverTime" in plan, plan
    assert "TEMP B-TREE" not in plan, plan  # no sort: the index gives the order

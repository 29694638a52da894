"""Table engine: the acks of a batch with their lease tokens are one statement, each row
deleted by its own compare-and-set on its token; a stale one deletes nothing and is named."""

from __future__ import annotations

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from spanner_queues import api
from spanner_queues.drivers import driver_for
from spanner_queues.engines import engines
from spanner_queues.exceptions import StaleAck
from spanner_queues.storage import rows
from tests.testapp.models import UserTasks

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.unless("supports_native_queues"),  # the native engine acks with mutations
]


def test_a_batch_of_leased_acks_is_one_delete_statement() -> None:
    for i in range(40):
        UserTasks.send(user_id=3, message_id=f"m{i:02d}", payload=str(i))
    got = api.receive(UserTasks, max_messages=40)
    assert len(got) == 40
    db = engines["default"].database
    if driver_for(db).replays_aborted_transactions:
        pytest.skip("Spanner's DB-API checks fetched rows on replay: it reads, then deletes, each")
    with CaptureQueriesContext(connections[db]) as queries:
        api.ack_many(UserTasks, got)
    deletes = [q["sql"] for q in queries.captured_queries if "DELETE" in q["sql"]]
    assert len(deletes) == 1, deletes
    assert not rows(UserTasks, db).exists()


def test_a_stale_token_among_the_batch_deletes_nothing_and_is_named() -> None:
    for i in range(5):
        UserTasks.send(user_id=4, message_id=f"m{i}", payload=str(i))
    got = api.receive(UserTasks, max_messages=5)
    db = engines["default"].database
    stale = got[2]
    held = rows(UserTasks, db).filter(message_id=stale.key[1])
    held._update_bookkeeping(lease_token="someone-else")  # as if leased again meanwhile
    with pytest.raises(StaleAck) as caught:
        api.ack_many(UserTasks, got)
    assert str(stale.key[1]) in str(caught.value)
    assert rows(UserTasks, db).count() == 5  # all or none

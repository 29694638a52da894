"""``unique_for`` under two senders at once: never two sends of a key in one window (the
second sender's transaction waits for the first's, then drops its send or fails)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from spanner_queues.uniqueness import SentKey, key_text, sent_key_id
from tests.testapp.models import UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


def _waiting_on_a_lock() -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            # (pg_locks, not pg_stat_activity: that one is a snapshot per transaction)
            "SELECT count(*) FROM pg_locks WHERE NOT granted"
        )
        return bool(cursor.fetchone()[0])


@pytest.mark.parametrize("window_ended", [False, True], ids=["first-send", "window-ended"])
def test_two_senders_at_once_never_both_send(window_ended: bool) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks that make a sender wait: PostgreSQL")
    if window_ended:  # the key's row exists, its window over: both senders update it
        SentKey.objects.create(
            pk=sent_key_id(UserTasks._meta.label, key_text((1, "digest"))),
            queue=UserTasks._meta.label,
            window_ends_at=timezone.now() - timedelta(hours=1),
        )
    started = threading.Event()
    outcome: dict[str, Any] = {}

    def second() -> None:
        try:
            started.set()
            outcome["message"] = UserTasks.send(
                user_id=1, message_id="digest", unique_for=timedelta(hours=1)
            )
        except Exception as exc:  # fail closed: an error is an answer, a second send is not
            outcome["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=second)
    with transaction.atomic():
        first = UserTasks.send(user_id=1, message_id="digest", unique_for=timedelta(hours=1))
        assert not first.dropped
        thread.start()
        assert started.wait(10)
        deadline = time.monotonic() + 20
        while not _waiting_on_a_lock():  # the second sender waits on the first's row
            assert time.monotonic() < deadline, f"the second sender never waited: {outcome}"
            time.sleep(0.01)
    thread.join(30)
    assert UserTasks.objects.count() == 1
    assert "error" in outcome or outcome["message"].dropped

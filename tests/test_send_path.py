"""What the quicker send path (issue 23) must keep: the engine a queue resolves to follows
settings changes and threads as ``engines[alias]`` does, and the ``Message`` that ``send()``
returns is the one the row holds."""

from __future__ import annotations

import threading

import pytest
from django.test import override_settings

from spanner_queues.engines import engine_for, engines
from tests.testapp.models import Jobs, UserTasks


@pytest.mark.engine_independent
def test_engine_for_follows_a_settings_change_and_comes_back() -> None:
    before = engine_for(Jobs)
    assert before is engines["default"]
    with override_settings(SPANNER_QUEUES={"default": {"OPTIONS": {"LEASE_SECONDS": 42}}}):
        inside = engine_for(Jobs)
        assert inside is not before and inside.params.lease.total_seconds() == 42
        assert engine_for(Jobs) is inside is engines["default"]
    after = engine_for(Jobs)
    assert after is engines["default"] and after.params.lease == before.params.lease


@pytest.mark.engine_independent
def test_engine_for_is_the_threads_own_engine() -> None:
    here = engine_for(Jobs)
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.extend([engine_for(Jobs), engines["default"]]))
    thread.start()
    thread.join()
    assert seen[0] is seen[1]  # that thread's engine, as engines[alias] gives it
    assert engine_for(Jobs) is here is engines["default"]


@pytest.mark.django_db(transaction=True)
def test_the_sent_message_is_the_stored_row() -> None:
    sent = UserTasks.send(user_id=7, message_id="m", payload={"a": 1})
    [stored] = [row.as_message() for row in UserTasks.objects.all()]
    assert (sent.queue, sent.key, sent.key_names, sent.payload) == (
        stored.queue, stored.key, stored.key_names, stored.payload,
    )  # fmt: skip
    assert sent.attempt == 0 and sent.lease_token is None and sent.lease_expires_at is None
    assert sent.send_time is not None and sent.deliver_time is not None
    assert repr(sent).startswith("Message(queue='testapp.UserTasks'")

"""The admin's "Cancel" action: a reason asked for, the message cancelled (``api.cancel``)
with the operator's name and reason on record, and an entry in the admin history."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType

from spanner_queues.controls import MessageCancellation
from spanner_queues.engines import engine_for
from spanner_queues.failures import key_text
from tests.admin.conftest import action_url, queue_url
from tests.testapp.models import Jobs

pytestmark = pytest.mark.django_db(transaction=True)
SELECTED = "_selected_key"


def test_cancel_asks_for_a_reason_then_cancels_with_a_record_and_logs(
    make_user: Any, login: Any
) -> None:
    client = login(make_user("view_queues", "cancel_message", name="dana"))
    Jobs.send(id="a", payload="x")
    Jobs.send(id="b", payload="y")
    assert "cancel" in [a.name for a in client.get(queue_url("testapp.Jobs")).context["actions"]]
    data = {"action": "cancel", SELECTED: ["a"]}
    confirm = client.post(action_url("testapp.Jobs"), data)
    assert 'name="reason"' in confirm.content.decode()
    # no reason: asked again, nothing done
    again = client.post(action_url("testapp.Jobs"), {**data, "post": "yes"})
    assert again.status_code == 200 and Jobs.objects.filter(id="a").exists()

    done = client.post(
        action_url("testapp.Jobs"),
        {**data, "post": "yes", "reason": "duplicate order"},
        follow=True,
    )
    assert [str(m) for m in done.context["messages"]] == [
        "Cancelled (duplicate order): 1 message of testapp.Jobs."
    ]
    assert list(Jobs.objects.values_list("id", flat=True)) == ["b"]
    db = engine_for(Jobs).database
    record = MessageCancellation.objects.using(db).get()
    assert (record.queue, record.message_key, record.reason, record.by, record.running) == (
        "testapp.Jobs",
        key_text(("a",)),
        "duplicate order",
        "dana",
        False,
    )
    [entry] = LogEntry.objects.filter(content_type=ContentType.objects.get_for_model(Jobs))
    assert (entry.object_id, entry.action_flag, entry.change_message) == (
        "a",
        CHANGE,
        "Cancelled (duplicate order).",
    )
    assert entry.user.username == "dana"

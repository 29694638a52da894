"""Actions: confirmation first, then one transaction through the API, logged in the history."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.utils import timezone

from spanner_queues import api
from spanner_queues.admin.browse import key_token
from spanner_queues.engines import engines
from tests.admin.conftest import action_url, queue_url
from tests.conftest import receive_due
from tests.testapp.models import Emails, EmailsDead, Jobs, UserTasks

pytestmark = pytest.mark.django_db(transaction=True)
SELECTED = "_selected_key"


def run(client: Client, label: str, action: str, keys: list[str], **extra: str) -> Any:
    """Choose the action (confirmation page), then confirm it; return both responses."""
    data = {"action": action, SELECTED: keys, **extra}
    confirm = client.post(action_url(label), data)
    done = client.post(action_url(label), {**data, "post": "yes"}, follow=True)
    return confirm, done


def notes(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def log_entries(model: type) -> list[LogEntry]:
    ct = ContentType.objects.get_for_model(model)
    return list(LogEntry.objects.filter(content_type=ct).order_by("object_id"))


def test_ack_asks_for_confirmation_then_deletes_and_logs(operator_client: Client) -> None:
    Jobs.send(id="a", payload="x")
    confirm = operator_client.post(action_url("testapp.Jobs"), {"action": "ack", SELECTED: ["a"]})
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert "Are you sure" in html and 'name="post" value="yes"' in html
    assert "csrfmiddlewaretoken" in html
    assert Jobs.objects.filter(id="a").exists()  # nothing happens before confirmation

    _, done = run(operator_client, "testapp.Jobs", "ack", ["a"])
    assert done.redirect_chain[-1][0] == queue_url("testapp.Jobs")
    assert notes(done) == ["Acked (deleted): 1 message of testapp.Jobs."]
    assert not Jobs.objects.exists()
    [entry] = log_entries(Jobs)
    assert (entry.object_id, entry.action_flag) == ("a", DELETION)
    assert entry.object_repr == "testapp.Jobs(id='a')"
    assert entry.change_message == "Acked (deleted)."
    assert entry.user.username == "operator"


def test_ack_a_selection_of_composite_keys(operator_client: Client) -> None:
    sent = [UserTasks.send(user_id=u, message_id=f"m,{u}", payload=u) for u in (1, 2, 3)]
    UserTasks.send(user_id=9, message_id="keep", payload="k")
    tokens = [key_token(m.key) for m in sent]
    confirm, done = run(operator_client, "testapp.UserTasks", "ack", tokens)
    assert len(confirm.context["rows"]) == 3
    assert notes(done) == ["Acked (deleted): 3 messages of testapp.UserTasks."]
    assert list(UserTasks.objects.values_list("user_id", "message_id")) == [(9, "keep")]
    assert [e.object_id for e in log_entries(UserTasks)] == tokens


def test_deliver_now_resends_same_key_and_payload(operator_client: Client) -> None:
    Jobs.send(id="later", payload={"k": 1}, delay=timedelta(hours=2))
    Jobs.send(id="leased", payload="y")
    receive_due(Jobs)
    api.stop_receiving(Jobs)  # a streaming engine would lease the re-sent messages at once
    before = timezone.now()
    _, done = run(operator_client, "testapp.Jobs", "deliver_now", ["later", "leased"])
    assert notes(done)[0].startswith("Delivered now")
    for row in Jobs.objects.all():
        assert row.deliver_time <= timezone.now() and row.deliver_time >= before
        if engines["default"].features.stores_bookkeeping_fields:
            assert row.attempts == 0 and row.lease_expires_at is None
    assert bytes(Jobs.objects.get(id="later").payload) == b'{"k":1}'
    assert {m.key for m in api.receive(Jobs, max_messages=5)} == {("later",), ("leased",)}
    assert {(e.object_id, e.action_flag) for e in log_entries(Jobs)} == {
        ("later", CHANGE),
        ("leased", CHANGE),
    }


def test_reschedule_to_a_chosen_time(operator_client: Client) -> None:
    Jobs.send(id="a", payload="p")
    confirm = operator_client.post(
        action_url("testapp.Jobs"), {"action": "reschedule", SELECTED: ["a"]}
    )
    assert 'type="datetime-local"' in confirm.content.decode()
    when = (timezone.localtime() + timedelta(days=1)).replace(microsecond=0)
    _, done = run(
        operator_client,
        "testapp.Jobs",
        "reschedule",
        ["a"],
        deliver_time=when.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    assert notes(done)[0].startswith("Rescheduled to " + when.isoformat())
    assert Jobs.objects.get(id="a").deliver_time == when
    assert api.receive(Jobs) == []
    assert "Rescheduled to" in log_entries(Jobs)[0].change_message


def test_reschedule_without_a_valid_time_changes_nothing(operator_client: Client) -> None:
    Jobs.send(id="a", payload="p")
    stored = Jobs.objects.get(id="a").deliver_time
    response = operator_client.post(
        action_url("testapp.Jobs"),
        {"action": "reschedule", SELECTED: ["a"], "post": "yes", "deliver_time": "tomorrow"},
    )
    assert response.status_code == 200 and response.context["form"].errors
    assert Jobs.objects.get(id="a").deliver_time == stored
    assert log_entries(Jobs) == []


def test_dead_letter_and_replay(operator_client: Client) -> None:
    Emails.send(id="e1", payload={"to": "ada@example.com"})
    api.receive(Emails)
    _, done = run(operator_client, "testapp.Emails", "dead_letter", ["e1"])
    assert notes(done) == [
        "Moved to the dead-letter queue testapp.EmailsDead: 1 message of testapp.Emails."
    ]
    assert not Emails.objects.exists()
    assert bytes(EmailsDead.objects.get(id="e1").payload) == b'{"to":"ada@example.com"}'

    _, done = run(operator_client, "testapp.EmailsDead", "replay", ["e1"])
    assert notes(done) == ["Replayed to testapp.Emails: 1 message of testapp.EmailsDead."]
    assert not EmailsDead.objects.exists() and Emails.objects.filter(id="e1").exists()
    if engines["default"].features.stores_bookkeeping_fields:
        assert Emails.objects.get(id="e1").attempts == 0
    assert log_entries(Emails)[0].change_message.startswith("Moved to the dead-letter queue")
    assert log_entries(EmailsDead)[0].change_message == "Replayed to testapp.Emails."


def test_actions_offered_match_the_queue(operator_client: Client) -> None:
    def offered(label: str) -> list[str]:
        return [a.name for a in operator_client.get(queue_url(label)).context["actions"]]

    assert offered("testapp.Jobs") == ["ack", "deliver_now", "reschedule"]
    assert offered("testapp.Emails") == ["ack", "deliver_now", "reschedule", "dead_letter"]
    assert offered("testapp.EmailsDead") == ["ack", "deliver_now", "reschedule", "replay"]
    Jobs.send(id="a", payload="x")
    response = operator_client.post(
        action_url("testapp.Jobs"), {"action": "dead_letter", SELECTED: ["a"]}, follow=True
    )
    assert notes(response) == ["No action selected."]
    assert Jobs.objects.exists()


def test_message_page_buttons_lead_to_the_confirmation(operator_client: Client) -> None:
    Emails.send(id="e1", payload="x")
    page = operator_client.get(f"{queue_url('testapp.Emails')}messages/e1/")
    html = page.content.decode()
    for name in ("ack", "deliver_now", "reschedule", "dead_letter"):
        assert f'name="action" value="{name}"' in html
    confirm = operator_client.post(
        action_url("testapp.Emails"), {"action": "dead_letter", SELECTED: ["e1"]}
    )
    assert "Are you sure" in confirm.content.decode()


def test_a_message_gone_meanwhile_changes_nothing(operator_client: Client) -> None:
    Jobs.send(id="a", payload="x")
    Jobs.send(id="b", payload="y")
    confirm = operator_client.post(
        action_url("testapp.Jobs"), {"action": "deliver_now", SELECTED: ["a", "b"]}
    )
    assert len(confirm.context["rows"]) == 2
    api.ack_many(Jobs, [("a",)])  # a receiver acks it before the operator confirms
    done = operator_client.post(
        action_url("testapp.Jobs"),
        {"action": "deliver_now", SELECTED: ["a", "b"], "post": "yes"},
        follow=True,
    )
    assert "no longer exist" in notes(done)[0] and "Nothing was changed" in notes(done)[0]
    assert list(Jobs.objects.values_list("id", flat=True)) == ["b"]
    assert log_entries(Jobs) == []


def test_a_failing_action_rolls_back_the_whole_selection(
    operator_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    Emails.send(id="a", payload="x")
    Emails.send(id="b", payload="y")
    from spanner_queues import deadletter
    from spanner_queues.exceptions import MessageAlreadyAcked

    real = deadletter.dead_letter

    def flaky(message: Any, *, using: str | None = None) -> Any:
        if message.key == ("b",):
            raise MessageAlreadyAcked("b was acked meanwhile")
        return real(message, using=using)

    monkeypatch.setattr(deadletter, "dead_letter", flaky)
    _, done = run(operator_client, "testapp.Emails", "dead_letter", ["a", "b"])
    assert notes(done) == ["Nothing was changed: b was acked meanwhile"]
    assert sorted(Emails.objects.values_list("id", flat=True)) == ["a", "b"]
    assert not EmailsDead.objects.exists() and log_entries(Emails) == []


def test_no_selection_and_get_change_nothing(operator_client: Client) -> None:
    Jobs.send(id="a", payload="x")
    response = operator_client.post(action_url("testapp.Jobs"), {"action": "ack"}, follow=True)
    assert notes(response)[0].startswith("Items must be selected")
    assert operator_client.get(action_url("testapp.Jobs")).status_code == 302
    assert Jobs.objects.exists()


@pytest.mark.parametrize(
    ("codenames", "action"),
    [
        (("view_queues",), "ack"),
        (("view_queues", "ack_message"), "deliver_now"),
        (("view_queues", "ack_message"), "reschedule"),
        (("view_queues", "reschedule_message"), "dead_letter"),
        (("ack_message",), "ack"),  # an action permission without the view permission
        (("view_queues", "ack_message"), "cancel"),
    ],
)
def test_actions_need_their_permission(
    make_user: Any, login: Any, codenames: tuple[str, ...], action: str
) -> None:
    client = login(make_user(*codenames))
    Emails.send(id="a", payload="x")
    for stage in ({}, {"post": "yes"}):
        response = client.post(
            action_url("testapp.Emails"), {"action": action, SELECTED: ["a"], **stage}
        )
        assert response.status_code == 403
    assert Emails.objects.filter(id="a").exists() and not LogEntry.objects.exists()


def test_one_action_permission_allows_only_its_actions(make_user: Any, login: Any) -> None:
    client = login(make_user("view_queues", "ack_message"))
    Jobs.send(id="a", payload="x")
    assert [a.name for a in client.get(queue_url("testapp.Jobs")).context["actions"]] == ["ack"]
    run(client, "testapp.Jobs", "ack", ["a"])
    assert not Jobs.objects.exists()


def test_forms_are_csrf_protected(make_user: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("view_queues", "ack_message"))
    Jobs.send(id="a", payload="x")
    data = {"action": "ack", SELECTED: ["a"], "post": "yes"}
    assert client.post(action_url("testapp.Jobs"), data).status_code == 403
    assert Jobs.objects.exists()
    page = client.get(queue_url("testapp.Jobs"))
    token = page.context["csrf_token"]
    assert 'name="csrfmiddlewaretoken"' in page.content.decode()
    data["csrfmiddlewaretoken"] = str(token)
    assert client.post(action_url("testapp.Jobs"), data).status_code == 302
    assert not Jobs.objects.exists()


def test_history_entries_show_on_the_admin_index(operator_client: Client) -> None:
    Jobs.send(id="logged", payload="x")
    run(operator_client, "testapp.Jobs", "ack", ["logged"])
    html = operator_client.get("/admin/").content.decode()
    assert "testapp.Jobs(id=&#x27;logged&#x27;)" in html

"""Admin under hostile input (issue 15 #12, #7): odd keys get their own links, out-of-range
times and unknown queues answer cleanly, permission first; ack checks the message is unchanged."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from spanner_queues import api
from spanner_queues.admin.browse import key_token, parse_key_token
from tests.admin.conftest import OVERVIEW, action_url, queue_url
from tests.admin.test_actions import SELECTED, log_entries, notes, run
from tests.testapp.models import Jobs, UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("odd", ["", ".", "..", "_", "a,b", "x/y", "_2E"])
def test_every_key_has_a_link_of_its_own(operator_client: Client, odd: str) -> None:
    Jobs.send(id=odd, payload="odd")
    token = key_token((odd,))
    assert token not in ("", ".", "..")
    assert parse_key_token(Jobs, token) == (odd,)
    listing = operator_client.get(queue_url("testapp.Jobs"))
    assert listing.status_code == 200
    page = operator_client.get(f"{queue_url('testapp.Jobs')}messages/{token}/")
    assert page.status_code == 200 and page.context["row"].message.key == (odd,)


def test_composite_keys_with_empty_parts_round_trip(operator_client: Client) -> None:
    UserTasks.send(user_id=1, message_id="", payload="")
    token = key_token((1, ""))
    assert parse_key_token(UserTasks, token) == (1, "")
    assert operator_client.get(f"{queue_url('testapp.UserTasks')}messages/{token}/").status_code
    assert operator_client.get(queue_url("testapp.UserTasks")).status_code == 200


@pytest.mark.parametrize("when", ["9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+05:00"])
def test_reschedule_out_of_range_is_a_form_error(operator_client: Client, when: str) -> None:
    Jobs.send(id="a", payload="p")
    stored = Jobs.objects.get(id="a").deliver_time  # (native: the commit's time, not send()'s)
    response = operator_client.post(
        action_url("testapp.Jobs"),
        {"action": "reschedule", SELECTED: ["a"], "post": "yes", "deliver_time": when},
    )
    assert response.status_code == 200 and response.context["form"].errors
    assert Jobs.objects.get(id="a").deliver_time == stored
    assert log_entries(Jobs) == []


def test_unknown_queue_in_an_action_url_checks_permission_first_and_lists_nothing(
    client: Client, operator_client: Client, make_user: Any, login: Any
) -> None:
    response = operator_client.post(f"{OVERVIEW}nope.nope/actions/", {"action": "ack"})
    assert response.status_code == 404
    assert "testapp" not in response.content.decode()
    anonymous = Client().post(f"{OVERVIEW}nope.nope/actions/", {"action": "ack"})
    assert anonymous.status_code in (302, 403)  # to the login page, never a 404
    nobody = login(make_user(name="nobody"))
    assert nobody.post(f"{OVERVIEW}nope.nope/actions/").status_code == 403


@pytest.mark.requires("stores_bookkeeping_fields")  # a replaced native message looks the same
def test_ack_refuses_a_message_changed_since_it_was_shown(
    operator_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like reschedule: a message replaced under its key since it was read is not deleted."""
    from spanner_queues.admin import views

    Jobs.send(id="k", payload="old")
    real = views.get_messages

    def replaced_meanwhile(model: Any, keys: Any) -> Any:
        found = real(model, keys)
        api.replace(Jobs, {"id": "k"}, payload="new")  # a producer, after the page read it
        return found

    monkeypatch.setattr(views, "get_messages", replaced_meanwhile)
    _, done = run(operator_client, "testapp.Jobs", "ack", ["k"])
    assert "Nothing was changed" in notes(done)[0]
    assert bytes(Jobs.objects.get(id="k").payload) == b"new"
    assert log_entries(Jobs) == []


# --- bidi controls and deep JSON (issue 23) ----------------------------------------------------
#: right-to-left override, isolate, zero-width space: text that reads other than it is
_SPOOF = "invoice\u202egpj.exe\u2067x\u200b"


def test_bidi_controls_in_keys_and_payloads_are_shown_as_visible_marks(
    operator_client: Client,
) -> None:
    Jobs.send(id=_SPOOF, payload=json_text({"file": _SPOOF}))
    token = key_token((_SPOOF,))
    pages = {
        "listing": operator_client.get(queue_url("testapp.Jobs")),
        "message": operator_client.get(f"{queue_url('testapp.Jobs')}messages/{token}/"),
        "confirm": run(operator_client, "testapp.Jobs", "ack", [token])[0],
    }
    for name, response in pages.items():
        assert response.status_code == 200, name
        # (form values carry the key as it is; they are sent back, never shown)
        html = re.sub(r' value="[^"]*"', "", response.content.decode())
        for char in "\u202e\u2067\u200b":
            assert char not in html, f"{name} page renders U+{ord(char):04X} raw"
    for name in ("listing", "message"):
        html = pages[name].content.decode()
        assert 'title="RIGHT-TO-LEFT OVERRIDE">U+202E</span>' in html, name
        assert ">U+2067</span>" in html and ">U+200B</span>" in html, name


def json_text(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)


def test_a_payload_of_json_nested_2000_deep_is_shown_as_text(operator_client: Client) -> None:
    """A bytes queue stores any bytes: the pages rendered it through ``json.loads`` (a 500 with
    ``RecursionError``)."""
    Jobs.send(id="deep", payload="[" * 2000 + "]" * 2000)
    assert operator_client.get(queue_url("testapp.Jobs")).status_code == 200
    detail = operator_client.get(f"{queue_url('testapp.Jobs')}messages/deep/")
    assert detail.status_code == 200 and detail.context["payload"].kind == "text"

"""The overview, message list and message pages, their permissions, and inert payloads."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client

from spanner_queues import api
from spanner_queues.admin.browse import key_token
from spanner_queues.monitoring import QueueDepthSample
from tests.admin.conftest import OVERVIEW, queue_url
from tests.testapp.models import Emails, EmailsDead, Jobs, Upload, UploadTasks, UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


def _row(response: Any, label: str) -> Any:
    return next(r for r in response.context["rows"] if r.label == label)


def test_admin_index_links_to_the_overview(operator_client: Client) -> None:
    response = operator_client.get("/admin/")
    assert response.status_code == 200
    assert f'href="{OVERVIEW}"' in response.content.decode()


@pytest.mark.requires("stores_bookkeeping_fields")  # leases and attempts are columns
def test_overview_counts_every_queue(operator_client: Client) -> None:
    for i in range(3):
        Jobs.send(id=f"ready-{i}", payload=i)
    Jobs.send(id="later", payload="x", delay=timedelta(hours=1))
    api.receive(Jobs)  # one in flight
    EmailsDead.send(payload="dead")
    response = operator_client.get(OVERVIEW)
    assert response.status_code == 200
    labels = [r.label for r in response.context["rows"] if r.label.startswith("testapp.")]
    assert labels == [
        "testapp.UserTasks",
        "testapp.Jobs",
        "testapp.UploadTasks",
        "testapp.Emails",
        "testapp.EmailsDead",
        "testapp.Greetings",
        "testapp.JsonEvents",
    ]
    jobs = _row(response, "testapp.Jobs")
    assert (jobs.stats.ready, jobs.stats.scheduled, jobs.stats.leased) == (2, 1, 1)
    assert jobs.stats.max_attempts == 1 and jobs.attempts  # the table engine counts attempts
    assert jobs.oldest_age != "—"
    emails = _row(response, "testapp.Emails")
    assert emails.dead_letter_queue == "testapp.EmailsDead" and emails.dead_letter_count == 1
    assert emails.max_attempts_limit == 3
    assert _row(response, "testapp.EmailsDead").dead_letter_of == ["testapp.Emails"]
    html = response.content.decode()
    assert f'href="{queue_url("testapp.Jobs")}"' in html
    assert "<svg" in html  # the depth chart of the sample just taken


def test_overview_get_writes_nothing(operator_client: Client) -> None:
    """A GET used to store depth samples (a write on GET; a PositiveIntegerField that a
    negative count made fail with a 500). The chart ends with the live counts instead."""
    Jobs.send(payload="a")
    response = operator_client.get(OVERVIEW)
    assert response.status_code == 200
    assert not QueueDepthSample.objects.exists()
    assert _row(response, "testapp.Jobs").chart is not None  # the live counts


@pytest.mark.requires("stores_bookkeeping_fields")  # the table engine's counts, on Django's cursor
def test_stats_add_up_while_messages_are_received() -> None:
    """Counts read in separate queries made ``scheduled`` negative (a 500 in the overview) when
    a message was received between them: counted as ready, then again as leased. Here a
    receiver leases a message after every statement the stats run."""
    from django.db import connection

    from spanner_queues.engines import engine_for

    Jobs.send_many([{"payload": "x"} for _ in range(5)])
    claims = [0]
    inside = [False]

    def claim_between(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not inside[0] and sql.lstrip().upper().startswith("SELECT"):
            inside[0] = True  # (not again for the receive's own statements)
            try:
                claims[0] += len(api.receive(Jobs))
            finally:
                inside[0] = False
        return result

    with connection.execute_wrapper(claim_between):
        stats = engine_for(Jobs).stats(Jobs)
    assert claims[0] >= 1
    assert stats.scheduled >= 0, stats
    assert stats.total == stats.ready + stats.scheduled + stats.leased == 5


@pytest.mark.requires("stores_bookkeeping_fields")  # leases and attempts are columns
def test_messages_list_filters_searches_orders_and_paginates(operator_client: Client) -> None:
    Jobs.send_many([{"id": f"job-{i:03d}", "payload": {"n": i}} for i in range(55)])
    Jobs.send(id="zz-later", payload="x", delay=timedelta(hours=1))
    [leased] = api.receive(Jobs)  # any one of them, e.g. job-000, becomes leased
    url = queue_url("testapp.Jobs")

    response = operator_client.get(url)
    assert response.status_code == 200
    page = response.context["page"]
    assert page.paginator.count == 56 and len(page.object_list) == 50
    assert leased.key not in [r.message.key for r in page.object_list]  # due after its lease
    assert operator_client.get(url, {"p": 2}).context["page"].object_list[-1].message.key == (
        "zz-later",
    )

    def keys(**params: str) -> list[str]:
        return [r.message.key[0] for r in operator_client.get(url, params).context["page"]]

    assert keys(state="leased") == [leased.key[0]]
    assert keys(state="scheduled") == ["zz-later"]
    assert len(keys(state="ready")) == 50
    assert keys(q="LATER") == ["zz-later"]  # case-insensitive key search
    assert keys(q="job-05") == [f"job-05{i}" for i in range(5)]
    assert keys(o="-deliver_time")[:2] == ["zz-later", leased.key[0]]  # leased: due after lease
    assert keys(q="nothing-matches") == []


def test_search_on_a_numeric_key_field(operator_client: Client) -> None:
    UserTasks.send(user_id=7, message_id="a", payload="x")
    UserTasks.send(user_id=8, message_id="b", payload="y")
    url = queue_url("testapp.UserTasks")
    found = operator_client.get(url, {"q": "7"}).context["page"].object_list
    assert [r.message.key for r in found] == [(7, "a")]


@pytest.mark.requires("stores_bookkeeping_fields")  # leases and attempts are columns
def test_message_page_shows_key_payload_and_bookkeeping(operator_client: Client) -> None:
    sent = UserTasks.send(user_id=42, message_id="m/1,2", payload={"b": [1, 2], "a": "é"})
    url = f"{queue_url('testapp.UserTasks')}messages/{key_token(sent.key)}/"
    response = operator_client.get(url)
    assert response.status_code == 200
    html = response.content.decode()
    assert response.context["payload"].kind == "json"
    assert "{\n  &quot;b&quot;: [\n    1,\n    2\n  ],\n  &quot;a&quot;: &quot;é&quot;\n}" in html
    assert "m/1,2" in html and "42" in html
    assert "Attempts" in html and "Lease expires" in html


@pytest.mark.parametrize(
    ("payload", "kind", "shown"),
    [
        ("plain text, not JSON", "text", "plain text, not JSON"),
        (b"\x00\xffbinary", "hex", "00 ff 62 69 6e 61 72 79"),
        (b"", "empty", "(empty)"),
    ],
)
def test_payload_kinds(operator_client: Client, payload: Any, kind: str, shown: str) -> None:
    sent = Jobs.send(payload=payload)
    response = operator_client.get(f"{queue_url('testapp.Jobs')}messages/{sent.key[0]}/")
    assert response.context["payload"].kind == kind
    assert shown in response.content.decode()


def test_interleaved_queue_with_a_foreign_key(operator_client: Client) -> None:
    upload = Upload.objects.create(name="u")
    sent = UploadTasks.send(upload=upload, message_id="thumb", payload="t")
    response = operator_client.get(queue_url("testapp.UploadTasks"))
    assert [r.message.key for r in response.context["page"]] == [sent.key]
    detail = operator_client.get(response.context["page"].object_list[0].url)
    assert detail.status_code == 200


HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def test_hostile_payload_and_key_render_inert(operator_client: Client) -> None:
    Jobs.send(id=HOSTILE[:60], payload=HOSTILE)
    Emails.send(id="json", payload={"html": HOSTILE})
    pages = [OVERVIEW, queue_url("testapp.Jobs"), queue_url("testapp.Emails")]
    for url in pages:
        html = operator_client.get(url).content.decode()
        assert "<script>alert" not in html and "<img src=x" not in html
    list_page = operator_client.get(queue_url("testapp.Jobs"))
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in list_page.content.decode()
    for url in (
        list_page.context["page"].object_list[0].url,
        f"{queue_url('testapp.Emails')}messages/json/",
    ):
        response = operator_client.get(url)
        assert response.status_code == 200
        html = response.content.decode()
        assert "<script>alert" not in html and "<img src=x" not in html
        assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_unknown_queue_bad_key_and_missing_message_are_404(operator_client: Client) -> None:
    assert operator_client.get(f"{OVERVIEW}testapp.nope/").status_code == 404
    assert operator_client.get(f"{OVERVIEW}auth.user/").status_code == 404
    base = queue_url("testapp.UserTasks")
    assert operator_client.get(f"{base}messages/not-an-int,x/").status_code == 404
    assert operator_client.get(f"{base}messages/1/").status_code == 404  # one value of two
    assert operator_client.get(f"{base}messages/1,gone/").status_code == 404


def test_pages_need_staff_and_the_view_permission(
    client: Client, make_user: Any, login: Any
) -> None:
    sent = Jobs.send(payload="x")
    pages = [
        OVERVIEW,
        queue_url("testapp.Jobs"),
        f"{queue_url('testapp.Jobs')}messages/{sent.key[0]}/",
    ]
    for url in pages:  # anonymous: the admin login page
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    login(make_user("view_queues", staff=False, name="not-staff"))
    for url in pages:
        assert client.get(url).status_code == 302
    login(make_user("ack_message", name="no-view"))
    for url in pages:
        assert client.get(url).status_code == 403
    assert OVERVIEW not in client.get("/admin/").content.decode()


def test_viewer_sees_pages_without_actions(viewer_client: Client) -> None:
    sent = Jobs.send(payload="x")
    response = viewer_client.get(queue_url("testapp.Jobs"))
    assert response.status_code == 200 and response.context["actions"] == []
    assert 'name="action"' not in response.content.decode()
    detail = viewer_client.get(f"{queue_url('testapp.Jobs')}messages/{sent.key[0]}/")
    assert detail.status_code == 200 and 'name="action"' not in detail.content.decode()


def test_a_queue_and_its_dead_letter_queue_show_its_failures_by_cause(
    operator_client: Client,
) -> None:
    from spanner_queues import causes
    from spanner_queues.engines import engine_for

    db = engine_for(Emails).database
    for n in range(3):
        causes.note("testapp.Emails", TimeoutError(f"connect to 10.0.0.{n}:25"), using=db)
    causes.note("testapp.Emails", ValueError("bad address <script>"), using=db, given_up=1)
    for url, heading in (
        (queue_url("testapp.Emails"), "Failures by cause"),
        (queue_url("testapp.EmailsDead"), "Failures of testapp.Emails by cause"),
    ):
        response = operator_client.get(url)
        assert response.status_code == 200
        label, found = response.context["causes"]
        assert label == "testapp.Emails"
        assert [(c.title, c.failures, c.given_up) for c in found] == [
            ("ValueError: bad address <script>", 1, 1),
            ("TimeoutError: connect to <ip>", 3, 0),
        ]
        page = response.content.decode()
        assert heading in page
        assert "TimeoutError: connect to &lt;ip&gt;" in page
        assert "<script>" not in page.split('id="sq-causes"')[1].split("</table>")[0]
    assert "sq-causes" not in operator_client.get(queue_url("testapp.Jobs")).content.decode()

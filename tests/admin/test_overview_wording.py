"""The admin's overview says what its figures are: due messages as due, not a "Ready" count that
is almost always 0; the highest attempt seen, not as "Max attempts"; an always-empty queue's
peak as 0; and it refreshes itself (with a pause control)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.staticfiles import finders
from django.test import Client
from django.utils import timezone

from spanner_queues import api
from spanner_queues.admin.chart import depth_chart
from spanner_queues.monitoring import QueueDepthSample
from tests.admin.conftest import OVERVIEW, queue_url
from tests.testapp.models import Emails, Jobs

pytestmark = pytest.mark.django_db(transaction=True)


def _headers(html: str) -> list[tuple[str, str]]:
    """(title, text) of each column header of the first result table."""
    table = html.split('id="result_list"', 1)[1].split("</thead>", 1)[0]
    found = []
    for attrs, text in re.findall(r'<th scope="col"([^>]*)>(.*?)</th>', table, re.S):
        title = re.search(r'title="([^"]*)"', attrs)
        found.append((title.group(1) if title else "", re.sub(r"<[^>]+>", "", text).strip()))
    return found


def test_overview_calls_due_messages_due_and_says_why_they_are_few(
    operator_client: Client,
) -> None:
    html = operator_client.get(OVERVIEW).content.decode()
    headers = dict((text, title) for title, text in _headers(html))
    assert "Ready" not in headers and "Leased" not in headers
    assert "leased at once" in headers["Due"]  # a tooltip: 0 while workers keep up
    assert "receiver" in headers["In flight"]


@pytest.mark.requires("supports_attempt_count")
def test_the_highest_attempt_seen_is_not_shown_as_a_limit(operator_client: Client) -> None:
    Emails.send(id="a", payload="x")
    api.receive(Emails)  # attempt 1
    html = operator_client.get(OVERVIEW).content.decode()
    texts = [text for _title, text in _headers(html)]
    assert "Max attempts" in texts and "Highest attempt" in texts and "Attempts" not in texts
    row = html.split('data-queue="testapp.Emails"', 1)[1].split("</tr>", 1)[0]
    assert '<td class="sq-num sq-highest-attempt">1</td>' in row
    assert '<td class="sq-num sq-max-attempts">3</td>' in row  # Emails: max_attempts = 3
    jobs = html.split('data-queue="testapp.Jobs"', 1)[1].split("</tr>", 1)[0]
    assert 'title="no max_attempts: retried until acked">unlimited' in jobs
    page = operator_client.get(queue_url("testapp.Emails")).content.decode()
    stats = page.split('id="sq-stats"', 1)[1].split("</table>", 1)[0]
    assert "Max attempts</th><td" in stats.replace(' class="sq-num"', "")
    assert "Highest attempt seen" in stats and ">3</td>" in stats


def test_an_always_empty_queue_charts_a_peak_of_0(operator_client: Client) -> None:
    now = timezone.now()
    for minutes in (30, 20, 10):
        QueueDepthSample.objects.create(
            queue="testapp.Jobs",
            measured_at=now - timedelta(minutes=minutes),
            total=0,
            ready=0,
            scheduled=0,
            leased=0,
        )
    chart = depth_chart(list(QueueDepthSample.objects.order_by("measured_at")))
    assert chart is not None and chart.peak == 0
    assert {point.split(",")[1] for point in chart.total.points.split()} == {"26.0"}  # bottom
    page = operator_client.get(queue_url("testapp.Jobs")).content.decode()
    assert "peak 0," in page and "peak 1" not in page


def test_overview_refreshes_itself_with_a_pause_control(operator_client: Client) -> None:
    html = operator_client.get(OVERVIEW).content.decode()
    assert re.search(r'<button[^>]+id="sq-refresh-toggle"', html)
    assert 'data-refresh-seconds="5"' in html
    assert "spanner_queues/admin/overview.js" in html
    assert finders.find("spanner_queues/admin/overview.js")
    # the script swaps the part of the page it fetches again
    assert 'id="sq-overview-live"' in html


def test_a_queue_page_keeps_its_state_names_for_urls_but_shows_due_and_in_flight(
    operator_client: Client,
) -> None:
    Jobs.send(id="a", payload="x")
    response = operator_client.get(queue_url("testapp.Jobs"))
    assert [c["display"] for c in response.context["state_choices"]][:2] == ["All", "Due"]
    assert (
        operator_client.get(queue_url("testapp.Jobs"), {"state": "ready"})
        .context["page"]
        .paginator.count
        == 1
    )
    html = response.content.decode()
    assert '<span class="sq-state sq-state-ready">due</span>' in html

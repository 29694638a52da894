"""The admin shows a relayed queue's topic and an inbox queue's subscription."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.admin.conftest import OVERVIEW, login, make_user, queue_url  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def viewer(make_user, login) -> Client:  # noqa: F811
    return login(make_user("view_queues", name="viewer"))


def test_the_overview_and_the_queue_pages_show_topic_and_subscription(viewer: Client) -> None:
    overview = viewer.get(OVERVIEW).content.decode()
    assert "&rarr; orders</span>" in overview
    assert "&larr; orders-billing</span>" in overview
    relayed = viewer.get(queue_url("pubsubapp.OrderEvents")).content.decode()
    assert "Relayed to the Pub/Sub topic <code>orders</code>" in relayed
    inbox = viewer.get(queue_url("pubsubapp.BillingInbox")).content.decode()
    assert "Inbox of the Pub/Sub subscription <code>orders-billing</code>" in inbox
    plain = viewer.get(queue_url("pubsubapp.OrderEventsDead")).content.decode()
    assert "Pub/Sub" not in plain

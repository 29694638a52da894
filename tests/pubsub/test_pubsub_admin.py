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


def test_the_archive_is_listed_read_only_with_a_replay_action(
    pubsub, django_user_model, client: Client
) -> None:
    from spanner_queues.contrib.pubsub.models import RelayedEvent
    from spanner_queues.worker import Worker
    from tests.pubsubapp.models import OrderEvents

    OrderEvents.send(order=5, message_id="m5", payload={"pk": 5})
    Worker(["pubsubapp.OrderEvents"], burst=True, install_signal_handlers=False).run()
    assert len(pubsub.pull()) == 1
    [event] = RelayedEvent.objects.all()
    client.force_login(django_user_model.objects.create_superuser("root", password="pw"))
    url = "/admin/spanner_queues_pubsub/relayedevent/"
    page = client.get(url, {"queue": "pubsubapp.OrderEvents"}).content.decode()
    assert event.event_id in page
    assert "Replay the selected events to their topics" in page
    assert client.get(f"{url}add/").status_code == 403
    answer = client.post(
        url, {"action": "replay_events", "_selected_action": [event.pk]}, follow=True
    ).content.decode()
    assert "1 event(s) published" in answer
    [again] = pubsub.pull()
    assert again.attributes["event_id"] == event.event_id
    assert again.attributes["replay_id"].startswith("replay-")

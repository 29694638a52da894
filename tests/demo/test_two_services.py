"""The demo's two services connected through Pub/Sub (``demo_project.shipping``): an order placed
in the shop (the "orders" service) is relayed to the topic ``orders``, the shipping service's
inbox takes it in once and prepares one packing slip; a copy Pub/Sub delivers again is dropped.
Runs on Google's Pub/Sub emulator (the demo installs the app only when Pub/Sub is at hand)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings

if not settings.DEMO_PUBSUB:
    pytest.skip("Pub/Sub is not at hand: the demo has no shipping service", allow_module_level=True)

from django.core.management import call_command
from google.cloud import pubsub_v1

from demo_project.accounts.services import sign_up
from demo_project.shipping.models import OrderPlacedEvents, PackingSlip, ShippingInbox
from demo_project.shop.models import Product
from demo_project.shop.services import place_order
from spanner_queues.contrib.pubsub.inbox import InboxPuller
from spanner_queues.contrib.pubsub.relay import EVENT_ID_ATTRIBUTE
from tests.conftest import wait_until
from tests.pubsub.conftest import pubsub_emulator  # noqa: F401 - the session's emulator

pytestmark = pytest.mark.django_db(transaction=True)
_projects = itertools.count()


@pytest.fixture
def topic(pubsub_emulator: Any, settings: Any) -> str:  # noqa: F811 - the fixture above
    """A project of its own on the emulator, with the demo's topic and subscription."""
    project = f"demo-{os.getpid()}-{next(_projects)}"
    settings.SPANNER_QUEUES_PUBSUB = {**settings.SPANNER_QUEUES_PUBSUB, "PROJECT": project}
    call_command("createpubsubresources", "--topic", "orders-shipping=orders", verbosity=0)
    return f"projects/{project}/topics/orders"


@pytest.fixture
def pull() -> Iterator[Callable[[], InboxPuller]]:
    """``pull()``: pull the shipping subscription until an event came, taken in or dropped."""
    subscriber = pubsub_v1.SubscriberClient()
    pullers: list[InboxPuller] = []

    def run() -> InboxPuller:
        puller = InboxPuller(ShippingInbox)
        wait_until(lambda: puller.pull_once(subscriber) > 0, 30)
        pullers.append(puller)
        return puller

    yield run
    subscriber.close()


def test_an_order_placed_in_the_shop_prepares_one_packing_slip_in_shipping(
    topic: str, pull: Callable[[], InboxPuller], drain: Callable[..., Any]
) -> None:
    customer = sign_up("ada", "ada@example.com")
    product = Product.objects.create(sku="SKU-1", name="Mug", price_cents=1200, stock=5)
    order = place_order(customer.pk, product)
    [event] = OrderPlacedEvents.objects.all()  # sent in the order's transaction
    drain(OrderPlacedEvents)  # the relay publishes it, then acks it
    assert not OrderPlacedEvents.objects.exists()
    assert pull().taken_in == 1
    drain(ShippingInbox)
    [slip] = PackingSlip.objects.all()
    assert slip.order_id == order.pk

    # a copy of the same event (a relay that crashed between Pub/Sub's confirmation and its
    # ack publishes again) is dropped by the inbox: still one packing slip
    publisher = pubsub_v1.PublisherClient()
    publisher.publish(topic, b"{}", **{EVENT_ID_ATTRIBUTE: slip.event_id}).result(timeout=30)
    again = pull()
    assert (again.taken_in, again.duplicates) == (0, 1)
    assert not ShippingInbox.objects.exists()
    assert PackingSlip.objects.count() == 1
    assert event.order == order.pk

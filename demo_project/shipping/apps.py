"""Two services connected through Pub/Sub: the shop (the "orders" service) relays each placed
order's event to the topic ``orders``; the shipping service's inbox takes it in once and
prepares a packing slip. Installed when Pub/Sub is at hand (``settings.DEMO_PUBSUB``)."""

from __future__ import annotations

from django.apps import AppConfig


class ShippingConfig(AppConfig):
    name = "demo_project.shipping"
    label = "shipping"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # the outbox registration needs the models, ready only now
        from demo_project.shipping.models import OrderPlacedEvents
        from demo_project.shop.models import Order
        from spanner_queues import outbox

        outbox.register(Order, queue=OrderPlacedEvents, on=("created",))

"""Two services in one test project: service A (``Order`` and its relayed ``OrderEvents``) and
service B (the ``BillingInbox`` and its receiver writing ``Charge``), for tests/pubsub."""

from __future__ import annotations

from django.apps import AppConfig


class PubSubAppConfig(AppConfig):
    name = "tests.pubsubapp"
    label = "pubsubapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from spanner_queues import outbox
        from tests.pubsubapp.models import Order

        outbox.register(Order, queue="pubsubapp.OrderEvents", on=("created",))

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.apps import AppConfig
from django.core import checks

from spanner_queues.contrib.pubsub.conf import (
    check_archive_window,
    check_dedup_window,
    check_queues,
    check_setting,
    relayed_queues,
)
from spanner_queues.exceptions import QueueConfigurationError
from spanner_queues.options import queue_options
from spanner_queues.receivers import receivers

if TYPE_CHECKING:
    from spanner_queues.worker import Worker


class PubSubConfig(AppConfig):
    """The outbox to and from Pub/Sub: registers the relay receiver of each queue with
    ``QueueMeta.pubsub_topic``, and gives ``runqueueworker`` an inbox puller for each queue
    with ``QueueMeta.pubsub_subscription`` it serves (``worker_services``)."""

    name = "spanner_queues.contrib.pubsub"
    label = "spanner_queues_pubsub"
    verbose_name = "Spanner queues Pub/Sub"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        checks.register(check_setting)
        checks.register(check_queues)
        checks.register(check_dedup_window)
        checks.register(check_archive_window)
        relayed = relayed_queues()
        if not relayed:
            return  # nothing to relay: google-cloud-pubsub is not even imported
        # the relay needs the app registry ready (the verbs) and the `pubsub` extra: without
        # it, PubSubUnavailable names the extra and stops every command at start-up
        from spanner_queues.contrib.pubsub.relay import register_relays

        try:
            register_relays(receivers, relayed)
        except QueueConfigurationError:  # a wrong setting is E301's to report
            return

    def worker_services(self, worker: Worker) -> list[Any]:
        """``runqueueworker``'s seam: an ``InboxPuller`` (not started) for each inbox queue
        among the worker's queues."""
        inboxes = [
            plan.model
            for plan in worker.plans
            if queue_options(plan.model).pubsub_subscription is not None
        ]
        if not inboxes:
            return []
        # the puller imports the app's model and google-cloud-pubsub: only for an inbox
        from spanner_queues.contrib.pubsub.inbox import InboxPuller

        return [InboxPuller(model) for model in inboxes]

"""``manage.py createpubsubresources``: for development and tests, create the Pub/Sub topics of
the relayed queues and the subscriptions of the inbox queues (the app never creates them by
itself: in production they are infrastructure, made by Terraform or gcloud)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from google.api_core import exceptions as google_exceptions
from google.cloud.pubsub_v1 import PublisherClient, SubscriberClient

from spanner_queues.contrib.pubsub.conf import inbox_queues, relayed_queues, resource_path
from spanner_queues.options import queue_options


class Command(BaseCommand):
    help = (
        "Create the Pub/Sub topic of every relayed queue (QueueMeta.pubsub_topic) and the "
        "subscription of every inbox queue (QueueMeta.pubsub_subscription, on the topic given "
        "by --topic SUBSCRIPTION=TOPIC), leaving existing ones as they are. For development: "
        "in production topics and subscriptions are infrastructure."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--topic",
            action="append",
            default=[],
            metavar="SUBSCRIPTION=TOPIC",
            help="The topic an inbox's subscription is created on (created too if missing).",
        )
        parser.add_argument(
            "--no-ordering",
            action="store_true",
            help="Create subscriptions without message ordering (default: ordered).",
        )
        parser.add_argument(
            "--ack-deadline",
            type=int,
            default=30,
            help="Ack deadline of created subscriptions in seconds (default: %(default)s).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        topics_of: dict[str, str] = {}
        for pair in options["topic"]:
            subscription, sep, topic = pair.partition("=")
            if not sep or not subscription or not topic:
                raise CommandError(f"--topic takes SUBSCRIPTION=TOPIC, not {pair!r}")
            topics_of[resource_path("subscriptions", subscription)] = resource_path("topics", topic)
        publisher = PublisherClient()
        subscriber = SubscriberClient()
        try:
            topics = {
                resource_path("topics", str(queue_options(m).pubsub_topic))
                for m in relayed_queues()
            }
            subscriptions = {
                resource_path("subscriptions", str(queue_options(m).pubsub_subscription))
                for m in inbox_queues()
            }
            missing = sorted(subscriptions - set(topics_of))
            if missing:
                raise CommandError(
                    f"no --topic for {', '.join(missing)} (give SUBSCRIPTION=TOPIC for each)"
                )
            for topic in sorted(topics | {topics_of[s] for s in subscriptions}):
                self._create(lambda t=topic: publisher.create_topic(name=t), "topic", topic)
            for subscription in sorted(subscriptions):
                request = {
                    "name": subscription,
                    "topic": topics_of[subscription],
                    "enable_message_ordering": not options["no_ordering"],
                    "ack_deadline_seconds": options["ack_deadline"],
                }
                self._create(
                    lambda r=request: subscriber.create_subscription(request=r),
                    "subscription",
                    subscription,
                )
        finally:
            subscriber.close()

    def _create(self, create: Any, kind: str, name: str) -> None:
        try:
            create()
        except google_exceptions.AlreadyExists:
            self.stdout.write(f"{kind} {name} exists")
        else:
            self.stdout.write(f"created {kind} {name}")

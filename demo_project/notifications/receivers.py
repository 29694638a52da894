"""The digest sender: a batch receiver, one email per user per batch."""

from __future__ import annotations

from collections import defaultdict

from django.contrib.auth.models import User
from django.core.mail import send_mail

from demo_project.notifications.models import Digest, Notifications
from spanner_queues import receiver
from spanner_queues.message import Message


@receiver(Notifications, batch=True, max_batch_size=100, atomic=False)
def send_digests(messages: list[Message]) -> None:
    """Pattern 8: group the batch by user and send each user one email. Not atomic (email
    is an external side effect): the worker acks the whole batch after this returns."""
    texts: dict[int, list[str]] = defaultdict(list)
    for message in messages:
        texts[message.key_dict["user_id"]].append(message.json()["text"])
    for user in User.objects.filter(pk__in=texts):
        lines = texts[user.pk]
        send_mail(
            f"{len(lines)} update(s) from the demo shop",
            "\n".join(f"- {line}" for line in lines),
            None,
            [user.email],
        )
        Digest.objects.create(user=user, items=len(lines))

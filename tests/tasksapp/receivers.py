"""The receiver of the test kit's examples (autodiscovered)."""

from __future__ import annotations

from datetime import timedelta

from spanner_queues import Retry, receiver
from spanner_queues.message import Message
from tests.tasksapp.models import Notifications, Thing


@receiver(Notifications)
def notify(message: Message) -> None:
    data = message.json()
    if data.get("kind") == "busy":
        raise Retry(after=timedelta(minutes=5))
    if data.get("kind") == "broken":
        raise RuntimeError("cannot notify")
    Thing.objects.create(num=data["num"], note="notified")

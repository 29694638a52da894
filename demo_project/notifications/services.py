"""``notify()``: queue a notification for the user's next digest."""

from __future__ import annotations

from datetime import datetime, timedelta

from demo_project.notifications.models import Notifications
from spanner_queues.message import Message
from spanner_queues.patterns import window_deliver_time

#: notifications of one user within this window go out in one email
WINDOW = timedelta(seconds=10)


def notify(user_id: int, text: str, *, now: datetime | None = None) -> Message:
    """Send in the caller's transaction, due at the end of the current window plus a stable
    per-user offset (so users spread over the window instead of all arriving at once)."""
    return Notifications.send(
        user_id=user_id,
        payload={"text": text},
        deliver_time=window_deliver_time(WINDOW, now=now, entity=user_id),
    )

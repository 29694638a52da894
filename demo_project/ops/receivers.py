"""The alerting receiver: a delivered heartbeat means its worker is dead."""

from __future__ import annotations

from django.core.mail import send_mail

from demo_project.ops.models import WorkerAlert, WorkerHeartbeats
from spanner_queues import receiver
from spanner_queues.message import Message

OPS_EMAIL = "ops@example.com"


@receiver(WorkerHeartbeats, atomic=False)
def worker_timed_out(message: Message) -> None:
    """Pattern 10: alert by email and record it (an alert may repeat after a crash here:
    at-least-once)."""
    worker_id = message.key_dict["worker_id"]
    info = message.text() if message.payload else ""
    send_mail(
        f"Worker {worker_id} stopped",
        f"No heartbeat from {worker_id} since {message.send_time}. Last beat: {info or '-'}.",
        None,
        [OPS_EMAIL],
    )
    WorkerAlert.objects.create(worker_id=worker_id, last_beat_at=message.send_time, info=info)

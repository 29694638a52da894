"""The soak receiver: fails while ``attempt < fail_below`` (a retry), else writes its effect
in the transaction that acks the message."""

from __future__ import annotations

import os
import time

from benchmarks.soakapp.models import SoakA, SoakB, SoakC, SoakEffect
from spanner_queues import receiver
from spanner_queues.message import Message


def handle(message: Message) -> None:
    spec = message.json() or {}
    if (message.attempt or 1) < int(spec.get("fail_below", 0)):
        raise RuntimeError("soak: a failure asked for (delivered again)")
    SoakEffect.objects.create(
        send_id=spec["send_id"],
        queue=message.queue,
        key=str(message.key[0]),
        attempt=message.attempt or 0,
        sent_at=float(spec["sent_at"]),
        handled_at=time.time(),
        pid=os.getpid(),
    )


for _model in (SoakA, SoakB, SoakC):
    receiver(_model)(handle)

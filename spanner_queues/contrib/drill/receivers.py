"""The drill receiver: optional work (``work_ms`` of sleep), then one effect row, in the
receiver's transaction, which also acks the message (the outbox way).

It is registered only in the drill's own worker processes (``SQ_DRILL_WORKER`` in the
environment, set by ``queuedrill``): a ``runqueueworker`` started without queue names serves
every queue that has a receiver, and the project's own workers must not take part in a drill."""

from __future__ import annotations

import os
import socket
import time

from spanner_queues import receiver
from spanner_queues.contrib.drill import counting
from spanner_queues.contrib.drill.models import DrillEffect, DrillMessage
from spanner_queues.engines import engine_for
from spanner_queues.message import Message

WORKER = f"{socket.gethostname()}-{os.getpid()}"


def handle_drill_message(message: Message) -> None:
    spec = message.json() or {}
    work_ms = float(spec.get("work_ms") or 0)
    if work_ms > 0:
        time.sleep(work_ms / 1000)
    DrillEffect.objects.using(engine_for(DrillMessage).database).create(
        run=str(spec.get("run", "")),
        key=str(message.key[0]),
        worker=WORKER,
        attempt=message.attempt or 0,  # 0: not known (a native ledger read failed)
        retries=counting.retries(),
    )


if os.environ.get("SQ_DRILL_WORKER"):
    receiver(DrillMessage)(handle_drill_message)

"""The drill receiver: optional work (``work_ms`` of sleep), then one effect row, in the
receiver's transaction, which also acks the message (the outbox way).

It is registered only in the drill's own worker processes (``SQ_DRILL_WORKER`` in the
environment, set by ``queuedrill``): a ``runqueueworker`` started without queue names serves
every queue that has a receiver, and the project's own workers must not take part in a drill."""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any

from spanner_queues import receiver
from spanner_queues.contrib.drill import counting
from spanner_queues.contrib.drill.models import DrillEffect, DrillMessage
from spanner_queues.engines import engine_for
from spanner_queues.message import Message

if TYPE_CHECKING:
    from spanner_queues.models import Queue

WORKER = f"{socket.gethostname()}-{os.getpid()}"


def handle_drill_message(message: Message) -> None:
    write_effect(message.json() or {}, str(message.key[0]), message, DrillMessage)


def write_effect(spec: dict[str, Any], key: str, message: Message, queue: type[Queue]) -> None:
    """``spec``'s work (``work_ms`` of sleep), then the effect row of ``key`` on ``queue``'s
    database, in the receiver's transaction."""
    work_ms = float(spec.get("work_ms") or 0)
    if work_ms > 0:
        time.sleep(work_ms / 1000)
    DrillEffect.objects.using(engine_for(queue).database).create(
        run=str(spec.get("run", "")),
        key=key,
        worker=WORKER,
        attempt=message.attempt or 0,  # 0: not known (a native ledger read failed)
        retries=counting.retries(),
    )


if os.environ.get("SQ_DRILL_WORKER"):
    receiver(DrillMessage)(handle_drill_message)

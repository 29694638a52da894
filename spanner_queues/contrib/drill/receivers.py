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

from django.db.models import Max

from spanner_queues import receiver
from spanner_queues.contrib.drill import counting
from spanner_queues.contrib.drill.models import DrillEffect, DrillMessage, DrillOrdered
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


def handle_ordered_message(message: Message) -> None:
    """``queuedrill --ordered``: the effect of message ``seq`` of its stream, with the highest
    number of the stream whose effect committed before (read in this transaction)."""
    write_ordered_effect(message.json() or {}, str(message.key[0]), message, DrillOrdered)


def write_ordered_effect(
    spec: dict[str, Any], stream: str, message: Message, queue: type[Queue]
) -> None:
    """The effect of message ``spec["seq"]`` of ``stream`` on ``queue``'s database, in the
    receiver's transaction, with the highest number of the stream whose effect had committed
    when this transaction read it (``DrillEffect.after``)."""
    run, seq = str(spec.get("run", "")), int(spec["seq"])
    database = engine_for(queue).database
    before = DrillEffect.objects.using(database).filter(run=run, key__startswith=f"{run}-{stream}-")
    after = before.aggregate(last=Max("seq"))["last"] or 0
    work_ms = float(spec.get("work_ms") or 0)
    if work_ms > 0:
        time.sleep(work_ms / 1000)
    DrillEffect.objects.using(database).create(
        run=run,
        key=f"{run}-{stream}-{seq:07d}",
        worker=WORKER,
        attempt=message.attempt or 0,
        retries=counting.retries(),
        seq=seq,
        after=after,
    )


if os.environ.get("SQ_DRILL_WORKER"):
    receiver(DrillMessage)(handle_drill_message)
    receiver(DrillOrdered)(handle_ordered_message)

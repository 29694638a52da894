"""Receivers of the worker tests (autodiscovered). ``work`` obeys its JSON payload:

- ``trace``: a file to append ``{"key", "attempt", "pid", "at", "deliver_time"}`` to on start;
- ``block``: wait until this file exists before going on; ``pause``: sleep this many seconds;
- ``then_send``: once unblocked, send a ``WorkItems`` message with this id (in the receiver's
  transaction: due when this one's work commits);
- ``fail``: raise on every attempt; ``fail_below``: raise while attempt < this;
- ``retry_after``: raise ``Retry(after=...)`` on the first run of this key (per ``trace``);
- ``outlive_lease``: keep running until well past the lease the message arrived with;
- ``exit``: raise ``SystemExit(exit)`` (a ``BaseException``, as ``sys.exit()`` in user code);
- ``ack_itself``: ``api.ack`` the message in the receiver's code;
- ``own_transaction`` (with ``"mode": "external"``): write the ``WorkLog`` row, sleep ``pause``
  seconds and ``api.ack`` the message in one ``transaction.atomic()`` block of its own; then,
  while attempt < ``spin_inside_below``, loop in Python inside that block (after the ack),
  and while attempt < ``spin_after_below``, after it committed;
- ``spin_below``: loop in Python (interruptible) while attempt < this;
- ``swallow_below``: while attempt < this, loop in Python catching every ``Exception`` (the
  worker's interrupt too), then return as if all went well;
- ``hang``: wait on the ``threading.Event`` ``HANGS[hang]`` (a C call Python cannot interrupt);
- ``"mode": "limited"``: run by ``work_limited``, whose own time limit is 0.5 s.
Then it writes a ``WorkLog`` row in the ack transaction. With ``"mode": "external"`` in the
payload, ``work_external`` (``atomic=False``) does the same outside any transaction and the worker
acks afterwards: on SQLite an atomic receiver holds the database's single write lock while it
runs, so a long receiver that must keep its lease by renewal there is not atomic.
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from spanner_queues import Retry, api, receiver
from spanner_queues.message import Message
from spanner_queues.patterns import periodic, resend_later
from tests.workerapp.models import (
    Dirty,
    Events,
    Jobs,
    Limited,
    Pings,
    Tasks,
    Ticks,
    WorkItems,
    WorkLog,
)


def _wait_for_file(path: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


def _trace(path: str, message: Message) -> None:
    """Append a start line (one short write: lines of concurrent processes do not mix)."""
    line = {
        "key": list(message.key),
        "attempt": message.attempt,
        "pid": os.getpid(),
        "at": timezone.now().isoformat(),
        "deliver_time": message.deliver_time.isoformat() if message.deliver_time else None,
    }
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def _runs(path: str, message: Message) -> int:
    """How many start lines ``message``'s key has in the trace file."""
    with open(path) as f:
        return sum(1 for raw in f if json.loads(raw)["key"] == list(message.key))


#: events the ``hang`` receivers wait on (a test sets them to let the thread go)
HANGS: dict[str, threading.Event] = {}


@receiver(WorkItems)
def work(message: Message) -> None:
    _obey(message, note="work")


@receiver(WorkItems, match={"mode": "limited"}, timeout=0.5)
def work_limited(message: Message) -> None:
    _obey(message, note="limited")


@receiver(WorkItems, match={"mode": "external"}, atomic=False)
def work_external(message: Message) -> None:
    _obey(message, note="external")


def _obey(message: Message, note: str) -> None:
    spec = message.json() if message.payload else {}
    if spec.get("own_transaction"):
        with transaction.atomic():
            WorkLog.objects.create(key=message.key[0], attempt=message.attempt, note=note)
            time.sleep(spec.get("pause", 0))
            api.ack(message)
            while message.attempt < spec.get("spin_inside_below", 0):
                time.sleep(0.01)
        while message.attempt < spec.get("spin_after_below", 0):
            time.sleep(0.01)
        return
    if "trace" in spec:
        _trace(spec["trace"], message)
    if "block" in spec:
        _wait_for_file(spec["block"])
    while message.attempt < spec.get("spin_below", 0):
        time.sleep(0.01)
    if message.attempt < spec.get("swallow_below", 0):
        try:
            while True:
                time.sleep(0.01)
        except Exception:
            pass
    if "hang" in spec:
        HANGS.setdefault(spec["hang"], threading.Event()).wait()
    if "then_send" in spec:
        WorkItems.send(id=spec["then_send"], payload={})
    if "pause" in spec:
        time.sleep(spec["pause"])
    if "exit" in spec:
        raise SystemExit(spec["exit"])
    if spec.get("fail") or message.attempt < spec.get("fail_below", 0):
        raise RuntimeError(f"asked to fail (attempt {message.attempt})")
    if "retry_after" in spec and _runs(spec["trace"], message) == 1:
        after = spec["retry_after"]  # (None: the back-off)
        raise Retry(after=None if after is None else timedelta(seconds=after), reason="asked")
    if spec.get("ack_itself"):
        api.ack(message)
    if spec.get("outlive_lease"):
        # Past the lease it came with, plus the first back-off: without renewal another
        # receiver could have it by now.
        until = message.lease_expires_at + timedelta(seconds=spec["outlive_lease"])
        while timezone.now() < until:
            time.sleep(0.05)
    WorkLog.objects.create(
        key=message.key[0], attempt=message.attempt, worker=str(os.getpid()), note=note
    )


@receiver(Pings)
def ping(message: Message) -> None:
    raise RuntimeError("pings always fail")


@receiver(Tasks, match={"kind": "email"})
def send_email(message: Message) -> None:
    WorkLog.objects.create(key=message.key[1], note="email")


@receiver(Tasks, match={"kind": "report"})
def build_report(message: Message) -> None:
    WorkLog.objects.create(key=message.key[1], note="report")


@receiver(Events, match={"type": "signup"})
def on_signup(message: Message) -> None:
    WorkLog.objects.create(key=message.key[0], note="signup")


@receiver(Events, match={"type": "webhook"}, atomic=False)
def on_webhook(message: Message) -> None:
    # An external side effect, outside any transaction; the worker acks afterwards.
    spec = message.json()
    with open(spec["trace"], "a") as f:
        f.write(message.key[0] + "\n")


@receiver(Events)
def on_other_event(message: Message) -> None:
    spec = message.json()
    if spec.get("type") == "resend" and spec.get("times", 0) > 0:
        resend_later(message, after=timedelta(0.0), payload=dict(spec, times=spec["times"] - 1))
        return
    WorkLog.objects.create(key=message.key[0], note=f"other:{spec.get('type')}")


@receiver(Dirty, batch=True, max_batch_size=25)
def recompute(messages: list[Message]) -> None:
    WorkLog.objects.bulk_create(
        [WorkLog(key=m.key[0], attempt=len(messages), note="batch") for m in messages]
    )


@periodic(Ticks, every=timedelta(seconds=0.5), key={"name": "tick"})
def tick(message: Message) -> None:
    WorkLog.objects.create(key="tick", note="tick")


@receiver(Jobs, match={"kind": "email"})
def job_email(message: Message) -> None:
    WorkLog.objects.create(key=message.key[1], note="job:email")


@receiver(Limited, atomic=False)
def limited(message: Message) -> None:
    """Append ``start`` and ``end`` lines (``{"key", "pid", "event"}``) to the payload's
    ``trace`` file around ``pause`` seconds of work (not atomic: on SQLite an atomic receiver
    holds the database's only write lock, and no two would overlap)."""
    spec = message.json()
    for event in ("start", "end"):
        if event == "end":
            time.sleep(spec.get("pause", 0))
        line = {"key": message.key[0], "pid": os.getpid(), "event": event}
        with open(spec["trace"], "a") as f:
            f.write(json.dumps(line) + "\n")

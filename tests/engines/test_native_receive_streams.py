"""Engines that receive through a background stream (native: ``RECEIVE_<Q>``): one stream per
queue and process, shared by threads, stopped with the worker and by ``api.stop_receiving``;
never holding more than was asked for, and renewing what it holds."""

from __future__ import annotations

import threading

import pytest
from django.core.management import call_command
from django.db import connections
from django.utils import timezone

from spanner_queues import api
from tests.conftest import wait_until
from tests.testapp.models import Jobs

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.requires("supports_native_queues"),
]


def streams(label: str = "testapp.Jobs") -> list:
    from spanner_queues.engines import native

    with native._streams_lock:
        return [r for (_, queue), r in native._streams.items() if queue == label]


def test_threads_share_one_stream_per_queue() -> None:
    Jobs.send_many([{"payload": str(i)} for i in range(8)])
    got: list = []

    def take() -> None:
        try:
            got.extend(wait_until(lambda: api.receive(Jobs, max_messages=2), timeout=30))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({m.key for m in got}) == len(got) == 8
    [receiver] = streams()  # one stream; its calls ask for what the threads wait for together
    assert receiver.streams_started >= 1


def test_stop_receiving_ends_the_stream_and_receive_starts_again() -> None:
    Jobs.send(payload="a")
    wait_until(lambda: api.receive(Jobs))
    [receiver] = streams()
    api.stop_receiving(Jobs, wait=10)
    assert streams() == [] and not receiver.running
    Jobs.send(payload="b")
    assert wait_until(lambda: api.receive(Jobs))[0].payload == b"b"
    assert len(streams()) == 1


def test_runqueueworker_leaves_no_stream_running() -> None:
    from tests.workerapp.models import WorkItems, WorkLog

    WorkItems.send(payload={})
    call_command("runqueueworker", "workerapp.WorkItems", "--burst", "--concurrency", "2")
    assert WorkLog.objects.count() == 1 and not WorkItems.objects.exists()
    assert streams("workerapp.WorkItems") == []


def test_the_stream_holds_no_more_than_asked_and_leaves_no_call_open_once_served() -> None:
    Jobs.send_many([{"payload": str(i)} for i in range(12)])
    first = wait_until(lambda: api.receive(Jobs, max_messages=2))
    [receiver] = streams()
    # The call asked for the demand and ended at the batch that met it: nothing read ahead,
    # no call left open, nothing held to renew.
    assert receiver.held <= 2
    assert wait_until(lambda: not receiver.calling, timeout=30)
    later = wait_until(lambda: api.receive(Jobs, max_messages=2), timeout=30)
    assert later and all(m.lease_expires_at > timezone.now() for m in later)
    assert receiver.lease_expiration_count == 0
    assert not {m.key for m in first} & {m.key for m in later}

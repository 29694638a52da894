"""The native engine on a Spanner that is strict with very short ``RECEIVE`` calls (the front's
``short_receive`` modes): Google documents no minimum ``max_duration``, so the engine's 1 ms
probe may be refused, in any words, or answered with nothing while a backlog waits. Neither may
strand a queue or fail it for good: a refused probe turns probes off for that stream and is
asked again at once in a long call; an empty probe never counts as a look at the queue. What a
database answered is learnt for all its queues: a refusal, or a few probes that came back empty
while rows were due, stop its probes."""

from __future__ import annotations

import pytest

from spanner_queues import api
from spanner_queues.engines.native.receive import USELESS_PROBES
from spanner_queues.message import Message
from spanner_queues.receivers import ReceiverRegistry
from spanner_queues.receivers import receiver as register_receiver
from spanner_queues.worker import Worker
from tests.conftest import wait_until
from tests.testapp.models import Greetings, UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


def _send(count: int) -> set[tuple]:
    sent = UserTasks.send_many(
        [{"user_id": 1, "message_id": f"m{i}", "payload": ""} for i in range(count)]
    )
    return {m.key for m in sent}


def test_a_refused_probe_is_asked_again_in_a_long_call_and_probes_stop(front) -> None:
    front.configure(short_receive="refuse")
    sent = _send(3)
    front.record()
    got = wait_until(lambda: api.receive(UserTasks, max_messages=3))
    for message in api.receive(UserTasks, max_messages=3, wait=0.5):
        got.append(message)
    assert {m.key for m in got} == sent
    calls = [r.sql for r in front.sql("RECEIVE_")]
    assert "'1ms'" in calls[0]  # the probe, refused
    assert calls[1:] and not any("'1ms'" in sql for sql in calls[1:])  # long calls only


def test_a_burst_loop_drains_a_backlog_whose_probes_answer_nothing(front) -> None:
    front.configure(short_receive="empty")
    sent = _send(25)
    api.settle_receiving(UserTasks, wait=0)
    got = []
    while True:  # a burst worker serving several queues: takes what is held, then settles
        batch = api.receive(UserTasks, max_messages=1, wait=0)
        for message in batch:
            api.ack(message)
        got.extend(batch)
        if not batch and api.settle_receiving(UserTasks):
            break
    assert {m.key for m in got} == sent
    assert not UserTasks.objects.exists()


def test_a_burst_worker_drains_a_backlog_whose_probes_answer_nothing(front) -> None:
    front.configure(short_receive="empty")
    sent = _send(25)
    done: list[tuple] = []
    registry = ReceiverRegistry()

    @register_receiver(UserTasks, registry=registry)
    def task(message: Message) -> None:
        done.append(message.key)

    @register_receiver(Greetings, registry=registry)
    def greeting(message: Message) -> None:
        pass

    worker = Worker(
        [UserTasks, Greetings], registry=registry, burst=True, install_signal_handlers=False
    )
    assert worker.run().processed == 25
    assert set(done) == sent
    assert not UserTasks.objects.exists()


def _probes(front, queue: str = "") -> list[str]:
    return [r.sql for r in front.sql(f"RECEIVE_{queue}") if "'1ms'" in r.sql]


def test_a_refused_probe_stops_the_probes_of_every_queue_on_that_database(front) -> None:
    front.configure(short_receive="refuse")
    sent = _send(2)
    got = wait_until(lambda: api.receive(UserTasks, max_messages=2))
    got += api.receive(UserTasks, max_messages=2, wait=0.5)
    assert {m.key for m in got} == sent
    assert len(_probes(front, "testapp_usertasks")) == 1
    Greetings.send(id=1, payload="hi")
    assert wait_until(lambda: api.receive(Greetings))
    assert _probes(front, "testapp_greetings") == []  # learnt on the database, not the stream


def test_probes_answered_with_nothing_under_a_backlog_stop_after_a_few(front) -> None:
    """An instance that answers a 1 ms call with nothing while a backlog waits: each probe
    costs a call and brings nothing. A database stops probing once a few probes came back
    empty right before a long call found rows that were due before the probe."""
    front.configure(short_receive="empty")
    sent = _send(12)
    got = []
    while len(got) < len(sent):  # one at a time, as a worker with one free slot asks
        for message in wait_until(lambda: api.receive(UserTasks, max_messages=1)):
            api.ack(message)
            got.append(message.key)
    assert set(got) == sent
    calls = [r.sql for r in front.sql("RECEIVE_testapp_usertasks")]
    useless = _probes(front, "testapp_usertasks")
    # (the first probe may open as the rows are sent, too soon to tell; 12 before, one per
    # message)
    assert len(useless) <= USELESS_PROBES + 1, (len(useless), len(calls))
    Greetings.send(id=2, payload="hi")
    assert wait_until(lambda: api.receive(Greetings))
    assert _probes(front, "testapp_greetings") == []


def test_probes_go_on_where_they_bring_rows(front) -> None:
    front.configure(short_receive="generous")
    sent = _send(12)
    got = []
    while len(got) < len(sent):
        for message in wait_until(lambda: api.receive(UserTasks, max_messages=1)):
            api.ack(message)
            got.append(message.key)
    assert set(got) == sent
    Greetings.send(id=3, payload="hi")
    assert wait_until(lambda: api.receive(Greetings))
    assert _probes(front, "testapp_greetings")  # the database answers probes: still asked

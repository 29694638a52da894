"""What a ``ReceiveStream`` leases and leaves unread: a settled stream (a burst worker's) asks a
backlog in probes, a brief call's rows on the wire are read within ``stall_seconds`` of its
start, and a ``stop()`` while a call is opening cancels that call.

The flaky ``tests/process/test_runqueueworker.py`` test of two burst workers: a brief call
(2 s) on a backlog leased what the front could push through gRPC's flow-control window in its
first second (about half the backlog), and the stream read it at the worker's pace, one row
per take, its stall restarting at every row: rows read past their 10 s lease were dropped as
expired and came back after the lease and a back-off, when both workers had exited (2 of 19
runs). No database: the stream's calls are the test's."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from spanner_queues import clock
from spanner_queues.engines.native.receive import LeasedRow, ReceiveStream
from tests.conftest import wait_until

pytestmark = pytest.mark.engine_independent

END = object()


def _parse(row: tuple[str, bool]) -> LeasedRow:
    key, last = row
    return LeasedRow((key,), b"", None, f"t-{key}", clock.now() + timedelta(seconds=10), last)


def _batch(keys: list[str]) -> list[tuple[str, bool]]:
    return [(key, i == len(keys) - 1) for i, key in enumerate(keys)]


def test_a_settled_stream_asks_a_backlog_in_probes() -> None:
    """A probe leases one batch and ends by itself; a brief call on a backlog leases batch
    after batch until its ``max_duration``, more than the worker takes within the lease."""
    backlog = [f"m{i:02}" for i in range(30)]
    opened: list[tuple[bool, bool]] = []  # (brief, probe) of each call

    def open_stream(max_batch_size: int, *, brief: bool = False, probe: bool = False) -> Any:
        opened.append((brief, probe))
        if probe:
            taken, backlog[:max_batch_size] = backlog[:max_batch_size], []
            return iter(_batch(taken))
        # a longer call: every batch due within its max_duration (here, all of them)
        leased, backlog[:] = list(backlog), []
        return iter([row for i in range(0, len(leased), 10) for row in _batch(leased[i : i + 10])])

    stream = ReceiveStream("q", open_stream, _parse, batch_size=10, linger=30.0, probe=True)
    try:
        assert stream.settle(0) is True  # a burst worker settles before its first receive
        stream.start()
        got: list[LeasedRow] = []
        wait_until(lambda: got.extend(stream.take(10, wait=1)) or len(got) >= 30, timeout=30)
        assert sorted(d.key[0] for d in got) == [f"m{i:02}" for i in range(30)]
        # the backlog went in probes of one batch each, none leased ahead of the takes
        assert opened[:3] == [(True, True)] * 3, opened
    finally:
        stream.stop(timeout=5)


def test_a_brief_call_is_read_on_within_stall_seconds_of_its_start() -> None:
    """A brief call whose rows exceed the demand stalls, but its rows on the wire (leased when
    the call sent them, not renewable until read) are read on once the call is
    ``stall_seconds`` old, however steadily the takes let one row through at a time."""
    rows: queue.Queue[Any] = queue.Queue()
    for row in _batch([f"m{i:03}" for i in range(200)]):
        rows.put(row)
    rows.put(END)

    def open_stream(max_batch_size: int, *, brief: bool = False, probe: bool = False) -> Any:
        while (row := rows.get()) is not END:
            yield row

    stream = ReceiveStream(
        "q", open_stream, _parse, cancel=lambda: rows.put(END), brief=True, stall_seconds=1.0
    )
    try:
        stream.start()
        deadline = time.monotonic() + 15
        while stream.held < 20 and time.monotonic() < deadline:
            stream.take(1, wait=1)  # a worker taking one message at a time
            time.sleep(0.05)  # (its pace)
        assert stream.held >= 20  # read on: the rest is held (and renewable), not on the wire
    finally:
        stream.stop(timeout=5)


def test_a_stop_while_a_call_opens_cancels_the_call() -> None:
    """``stop()`` between the stream's decision to call and the call's existence cancelled
    nothing: the call ran to its ``max_duration``, leasing what it found for nobody."""
    in_gap, go_on, cancelled = threading.Event(), threading.Event(), threading.Event()
    calls: list[queue.Queue[Any]] = []

    def open_stream(max_batch_size: int, *, brief: bool = False, probe: bool = False) -> Any:
        in_gap.set()
        assert go_on.wait(5)  # the call is being opened: the stop comes now
        call: queue.Queue[Any] = queue.Queue()
        calls.append(call)  # the call exists: cancel reaches it from here on

        def rows() -> Iterator[Any]:
            while (row := call.get(timeout=30)) is not END:  # its max_duration
                yield row

        return rows()

    def cancel() -> None:
        if calls:
            cancelled.set()
            calls[-1].put(END)

    stream = ReceiveStream("q", open_stream, _parse, cancel=cancel, linger=30.0)
    try:
        stream.start()
        stream.take(1, wait=0)
        assert in_gap.wait(5)
        stream.stop()
        go_on.set()
        assert cancelled.wait(5)  # cancelled as soon as it existed
        wait_until(lambda: not stream.running, timeout=5)
    finally:
        go_on.set()
        for call in calls:
            call.put(END)
        stream.stop(timeout=5)


def test_a_backlog_is_probed_a_whole_batch_at_a_time_and_a_take_gets_all_it_asks_for() -> None:
    """Under a backlog (the last probe came back full) a probe asks a whole batch, not the
    demand left (a take of one message cost a RECEIVE call per message), and a take that asks
    for more than one batch gets them all rather than one batch (a batch receiver of 20 ran
    twice per 20 messages)."""
    backlog = [f"m{i:03}" for i in range(100)]
    asked: list[int] = []  # max_batch_size of each call

    def open_stream(max_batch_size: int, *, brief: bool = False, probe: bool = False) -> Any:
        assert probe
        asked.append(max_batch_size)
        taken, backlog[:max_batch_size] = backlog[:max_batch_size], []
        return iter(_batch(taken))

    stream = ReceiveStream("q", open_stream, _parse, batch_size=10, linger=30.0, probe=True)
    try:
        stream.start()
        assert len(stream.take(20, wait=5)) == 20  # two batches of 10, one take
        singles = [stream.take(1, wait=5) for _ in range(20)]
        assert all(len(s) == 1 for s in singles)
        # 1 + 1 for the first take, then whole batches for takes of one: 2 more, not 20
        assert len(asked) <= 5, asked
        assert stream.held <= 10  # held ahead: at most the demand and one batch
    finally:
        stream.stop(timeout=5)

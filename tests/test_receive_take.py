"""How long ``ReceiveStream.take`` waits for a first row. A call open longer than the take's wait
that brought nothing means nothing is due, so the take returns after a moment; but not when
this process sent to the queue after that call opened: the open call has not yet been shown
that message. CI's native stage lost this race (the front leased and sent the row later than
the moment) and an ``api.receive()`` right after a commit came back empty. No database: the
stream's call is the test's."""

from __future__ import annotations

import queue
import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from spanner_queues import clock
from spanner_queues.engines.native.receive import WARM_WAIT, LeasedRow, ReceiveStream
from tests.conftest import wait_until

pytestmark = pytest.mark.engine_independent

END = object()


def _stream(rows: queue.Queue[Any]) -> ReceiveStream:
    def open_stream(max_batch_size: int, *, brief: bool = False, probe: bool = False) -> Any:
        while (row := rows.get()) is not END:
            yield row

    def parse(row: str) -> LeasedRow:
        return LeasedRow((row,), b"", None, f"t-{row}", clock.now() + timedelta(seconds=10), True)

    return ReceiveStream("q", open_stream, parse, cancel=lambda: rows.put(END), linger=30.0)


def _open_call_older_than(stream: ReceiveStream, seconds: float) -> None:
    stream.start()
    assert stream.take(1, wait=0.01) == []  # short: a call opens for the rest
    wait_until(lambda: stream.calling, timeout=5)
    time.sleep(seconds)  # the call's age is what is under test


@pytest.mark.parametrize("sent_after_open", [False, True])
def test_a_take_after_a_send_waits_its_full_wait_for_the_open_call(sent_after_open: bool) -> None:
    rows: queue.Queue[Any] = queue.Queue()
    stream = _stream(rows)
    try:
        _open_call_older_than(stream, 0.3)
        last_sent = time.monotonic() if sent_after_open else None
        # the row the call brings, later than the warm moment and sooner than the wait
        timer = threading.Timer(WARM_WAIT + 0.2, rows.put, args=("a",))
        timer.start()
        taken = stream.take(1, wait=0.3 if not sent_after_open else 5.0, last_sent=last_sent)
        timer.join()
        if sent_after_open:
            assert [d.key for d in taken] == [("a",)]
        else:  # nothing sent since the call opened: nothing is due, back after a moment
            assert taken == []
    finally:
        stream.stop(timeout=5)


def test_a_take_wakes_the_idle_stream_at_once() -> None:
    """The stream's thread looked at the demand before a take counted itself and slept out
    its 0.5 s poll: a take waiting less than that came back empty with a row due (CI's native
    stage: an ``api.receive()`` right after a commit, a burst worker, the test kit's drain)."""
    due: list[str] = []
    calls = threading.Semaphore(0)

    def open_stream(max_batch_size: int, *, brief: bool = False, probe: bool = False) -> Any:
        calls.release()
        while due:  # one look, as a probe: what is due, then the call ends
            yield due.pop(0)

    def parse(row: str) -> LeasedRow:
        return LeasedRow((row,), b"", None, f"t-{row}", clock.now() + timedelta(seconds=10), True)

    stream = ReceiveStream("q", open_stream, parse, linger=30.0, probe=True)
    try:
        stream.start()
        due.append("a")
        assert [d.key for d in stream.take(1, wait=5)] == [("a",)]
        wait_until(lambda: not stream.calling, timeout=5)  # the thread goes back to waiting
        due.append("b")
        # The race, made certain: the thread looks at the demand between the take's ``want``
        # and the take counting itself (it finds none and goes back to its poll).
        looked_idle = threading.Event()
        unmet, want = stream._unmet, stream.want

        def unmet_seen() -> bool:
            found = unmet()
            if not found:
                looked_idle.set()
            return found

        def want_then_look(max_messages: int) -> None:
            looked_idle.clear()
            want(max_messages)
            assert looked_idle.wait(5)

        stream._unmet = unmet_seen  # type: ignore[method-assign]
        stream.want = want_then_look  # type: ignore[method-assign]
        assert [d.key for d in stream.take(1, wait=0.3)] == [("b",)]
    finally:
        stream.stop(timeout=5)


def test_a_take_that_waits_for_nothing_still_hears_its_new_streams_first_answer() -> None:
    """A worker of several queues takes what each stream holds now (``wait=0``); a stream just
    opened has answered nothing yet, so the take waits for its first call to end: a probe's
    rows come back with it (a burst worker drained nothing: it saw no call open and stopped),
    and a queue that is gone raises (the worker never heard of a dropped queue)."""
    from google.api_core import exceptions as gexc

    from spanner_queues.exceptions import QueueError

    release = threading.Event()

    def open_stream(max_batch_size: int, *, brief: bool = False, probe: bool = False) -> Any:
        assert release.wait(5)  # the first call answers a moment later
        yield "a"

    def parse(row: str) -> LeasedRow:
        return LeasedRow((row,), b"", None, f"t-{row}", clock.now() + timedelta(seconds=10), True)

    stream = ReceiveStream("q", open_stream, parse, linger=30.0, probe=True)
    try:
        stream.start()
        threading.Timer(0.2, release.set).start()
        assert [d.key for d in stream.take(1, wait=0, first_answer=5)] == [("a",)]
    finally:
        stream.stop(timeout=5)

    def gone(max_batch_size: int, *, brief: bool = False, probe: bool = False) -> Any:
        assert release.wait(5)
        raise gexc.InvalidArgument("Table-valued function not found: RECEIVE_q")
        yield  # a generator, as the real calls

    broken = ReceiveStream("q", gone, parse, linger=30.0, probe=True)
    try:
        broken.start()
        with pytest.raises(QueueError, match="INVALID_ARGUMENT"):
            broken.take(1, wait=0, first_answer=5)
    finally:
        broken.stop(timeout=5)

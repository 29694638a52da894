"""A RECEIVE stream renews the rows it holds (``ReceiveStream``: its own thread, or the engine's
``renew_leases``) while ``take`` hands rows out. A row handed out while its renewal was on the
wire left with the token that renewal rotated out: the worker's own renewal of that token then
found no lease, and the work was rolled back and the message delivered again. No database: the
stream's calls and its renewal are the test's."""

from __future__ import annotations

import queue
import threading
from datetime import timedelta
from typing import Any

import pytest

from spanner_queues import clock
from spanner_queues.engines.native.receive import LeasedRow, ReceiveStream
from tests.conftest import wait_until

pytestmark = pytest.mark.engine_independent

END = object()


def test_a_row_under_renewal_is_handed_out_with_its_renewed_token() -> None:
    rows: queue.Queue[Any] = queue.Queue()
    renewing = threading.Event()
    answer = threading.Event()

    def open_stream(max_batch_size: int, *, brief: bool = False, probe: bool = False) -> Any:
        while (row := rows.get()) is not END:
            yield row

    def parse(row: str) -> LeasedRow:
        return LeasedRow(
            key=(row,),
            payload=b"",
            deliver_time=None,
            lease_token=f"old-{row}",
            # due for renewal at once (within ``renew_within``), not yet expired
            lease_expires_at=clock.now() + timedelta(seconds=3),
            last_in_batch=True,
        )

    def renew(tokens: list[str]) -> dict[str, tuple[str | None, Any]]:
        renewing.set()
        assert answer.wait(10)
        return {t: (t.replace("old-", "new-"), clock.now() + timedelta(seconds=10)) for t in tokens}

    stream = ReceiveStream(
        "q", open_stream, parse, cancel=lambda: rows.put(END), renew=renew, linger=30.0
    )
    try:
        stream.start()
        assert stream.take(1, wait=0.2) == []  # short: a call opens for the rest
        rows.put("a")
        wait_until(lambda: stream.held == 1, timeout=10)
        assert renewing.wait(10)  # the renewal of old-a is on the wire
        first = stream.take(1, wait=0.2)  # a take meanwhile
        answer.set()
        taken = first or stream.take(1, wait=5)
        assert [d.lease_token for d in taken] == ["new-a"]
    finally:
        answer.set()
        stream.stop(timeout=5)


def test_a_failed_renewal_of_held_rows_leaves_them_to_take() -> None:
    stream = ReceiveStream("q", lambda *a, **k: iter(()), lambda row: row, linger=30.0)
    row = LeasedRow(("a",), b"", None, "t-a", clock.now() + timedelta(seconds=3), True)
    stream._buffer.append(row)
    stream.want(1)
    tokens = stream.held_tokens_due()
    assert tokens == ["t-a"]
    stream.renewal_failed(tokens)
    assert [d.lease_token for d in stream.take(1, wait=0)] == ["t-a"]

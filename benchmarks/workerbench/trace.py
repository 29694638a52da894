"""Receiver-start times for the latency measurement: ``key time.time()`` lines appended to
``$SQ_BENCH_TRACE`` (nothing at all when it is unset, as in the drain measurement)."""

from __future__ import annotations

import os
import threading
import time
from typing import IO

_lock = threading.Lock()
_file: IO[str] | None = None
PATH = os.environ.get("SQ_BENCH_TRACE")


def started(key: str) -> None:
    global _file
    if PATH is None:
        return
    now = time.time()
    with _lock:
        if _file is None:
            _file = open(PATH, "a", buffering=1)  # kept open for the process
        _file.write(f"{key} {now:.6f}\n")

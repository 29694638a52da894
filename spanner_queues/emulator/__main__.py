"""``python -m spanner_queues.emulator --host-port 127.0.0.1:PORT``: a private Cloud Spanner
emulator behind the queue-aware front. Prints ``ready HOST:PORT`` when clients may connect
(``SPANNER_EMULATOR_HOST=HOST:PORT``); SIGTERM or SIGINT stops the front and the emulator."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from spanner_queues.emulator import EmulatorNotFound, QueueEmulator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spanner_queues.emulator",
        description="Cloud Spanner emulator with Spanner queues (CREATE QUEUE, RECEIVE, "
        "RENEWLEASE, Send/Ack mutations) for local development and tests.",
    )
    parser.add_argument(
        "--host-port",
        default="127.0.0.1:9010",
        help="where clients connect (SPANNER_EMULATOR_HOST); port 0 picks a free one",
    )
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started this one is gone (tests, tools)",
    )
    args = parser.parse_args(argv)
    parent = os.getppid()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        emulator = QueueEmulator(args.host_port).start()
    except EmulatorNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        print(f"ready {emulator.host} (export SPANNER_EMULATOR_HOST={emulator.host})", flush=True)
        while not stop.wait(1.0):
            if args.exit_with_parent and os.getppid() != parent:
                break  # the parent died without stopping us
    finally:
        emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

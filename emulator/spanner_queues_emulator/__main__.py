"""``python -m spanner_queues_emulator --host-port 127.0.0.1:PORT`` (or the console script
``spanner-queues-emulator``): a private Cloud Spanner
emulator behind the queue-aware front. Prints ``ready HOST:PORT`` when clients may connect
(``SPANNER_EMULATOR_HOST=HOST:PORT``); SIGTERM or SIGINT stops the front and the emulator
(exit 0). Exits 1 when the port is taken or when the emulator behind the front dies, 2 on a bad
argument or without the emulator binary. Listening beyond loopback prints a warning: the front
is an unauthenticated Spanner API."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import sys
import threading

from spanner_queues_emulator import EmulatorNotFound, QueueEmulator
from spanner_queues_emulator.answers import (
    BACKOFF_ENV,
    BACKOFF_MODES,
    RETRY_INFO_ENV,
    RETRY_INFO_MODES,
)
from spanner_queues_emulator.front import AddressInUse
from spanner_queues_emulator.queues import DELIVER_TIME_ENV, DELIVER_TIME_MODES
from spanner_queues_emulator.receiving import (
    SHORT_RECEIVE_ENV,
    SHORT_RECEIVE_MODES,
    SHORT_RECEIVE_SECONDS,
)


def host_port(text: str) -> str:
    """``HOST:PORT`` with a port from 0 to 65535 (``[::1]:9010`` for IPv6); else
    ``argparse.ArgumentTypeError``."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not HOST:PORT with a port from 0 to 65535 (0 picks a free one), "
            "for example 127.0.0.1:9010"
        )
    return f"{host}:{int(port)}"


def exposed(host: str) -> bool:
    """Whether a front listening on ``host`` may be reachable from other machines (anything
    but ``localhost`` and loopback addresses)."""
    name = host.strip("[]")
    if name.lower() == "localhost":
        return False
    try:
        return not ipaddress.ip_address(name).is_loopback
    except ValueError:
        return True  # a host name: it may resolve to any interface


def _parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m spanner_queues_emulator",
        description="Cloud Spanner emulator with Spanner queues (CREATE QUEUE, RECEIVE, "
        "RENEWLEASE, Send/Ack mutations) for local development and tests.",
    )
    parser.add_argument(
        "--host-port",
        type=host_port,
        default="127.0.0.1:9010",
        metavar="HOST:PORT",
        help="where clients connect (SPANNER_EMULATOR_HOST); port 0 picks a free one",
    )
    parser.add_argument(
        "--short-receive",
        choices=SHORT_RECEIVE_MODES,
        default=None,
        help="how a RECEIVE whose max_duration is under "
        f"{SHORT_RECEIVE_SECONDS:g} s is answered, which Google leaves open: generous (looks "
        "at the queue once whatever the duration), empty (answers nothing), refuse "
        f"(INVALID_ARGUMENT); default: ${SHORT_RECEIVE_ENV}, else generous",
    )
    parser.add_argument(
        "--backoff",
        choices=BACKOFF_MODES,
        default=None,
        help="when a message whose lease ended unacked is due again, which Google leaves open: "
        "exponential (1 s doubling from the lease's end), none (as the lease ends), slow "
        f"(10 s doubling); default: ${BACKOFF_ENV}, else exponential",
    )
    parser.add_argument(
        "--retry-info",
        choices=RETRY_INFO_MODES,
        default=None,
        help="whether an ABORTED carries a RetryInfo: always (as Cloud Spanner), never (as "
        f"Google's emulator); default: ${RETRY_INFO_ENV}, else always",
    )
    parser.add_argument(
        "--deliver-time",
        choices=DELIVER_TIME_MODES,
        default=None,
        help="what a lease does to a message's DeliverTime, which Google leaves open: kept "
        "(the sender's time, through every lease), lease_expiry (moved to the lease's expiry "
        "on each lease), next_due (moved to when the message is next due); default: "
        f"${DELIVER_TIME_ENV}, else kept",
    )
    parser.add_argument(
        "--exit-with-parent",
        action="store_true",
        help="stop when the process that started this one is gone (tests, tools)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    host = args.host_port.rpartition(":")[0]
    if exposed(host):
        print(
            f"warning: listening on {host}: the emulator front is an unauthenticated Spanner "
            "API (anyone who reaches the port can read, write and drop its databases); use "
            "127.0.0.1 unless other machines must connect",
            file=sys.stderr,
            flush=True,
        )
    parent = os.getppid()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        emulator = QueueEmulator(
            args.host_port,
            short_receive=args.short_receive,
            backoff=args.backoff,
            retry_info=args.retry_info,
            deliver_time=args.deliver_time,
        ).start()
    except ValueError as exc:  # a bad SPANNER_QUEUES_EMULATOR_* mode
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except EmulatorNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except AddressInUse as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    code = 0
    try:
        print(f"ready {emulator.host} (export SPANNER_EMULATOR_HOST={emulator.host})", flush=True)
        while not stop.wait(0.2):
            if emulator.failed.is_set():  # logged by the emulator's watcher
                code = 1
                break
            if args.exit_with_parent and os.getppid() != parent:
                break  # the parent died without stopping us
    finally:
        emulator.stop()
    return code


def run() -> None:
    """The ``spanner-queues-emulator`` console script (and ``python -m``). Once ``main`` has
    stopped the front and the emulator, the process ends without the interpreter's teardown:
    after importing grpc and google-cloud-spanner it took 2.5-3.7 s on a loaded 2-core machine
    (every Ctrl-C of a program that started a private front waited for it)."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    run()

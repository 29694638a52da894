"""The first SIGTERM stops the worker even when it lands inside a listener that holds a plain
lock: the handler runs on the main thread between two bytecodes, and its "stopping" event
waited, on that very thread, for the lock the thread held (the health probes' listener holds
one for every event of the intake loop): the worker never stopped and its probes hung. The
stop now runs on a thread of its own. A second signal still ends the process at once."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

from spanner_queues.worker import Worker, WorkerEvent
from tests.conftest import wait_until

pytestmark = pytest.mark.engine_independent


def _worker(listener: Any, abort: Any) -> Worker:
    return Worker(
        ["workerapp.WorkItems"], install_signal_handlers=False, listeners=[listener], abort=abort
    )


def test_a_signal_inside_a_listener_holding_its_lock_still_stops_the_worker() -> None:
    lock = threading.Lock()  # a listener's plain lock, as WorkerHealth's
    events: list[str] = []

    def listener(event: WorkerEvent) -> None:
        with lock:
            events.append(event.name)

    worker = _worker(listener, abort=lambda: None)
    returned = threading.Event()

    def main_thread_inside_the_listener() -> None:
        with lock:  # the signal lands here
            worker._on_signal(signal.SIGTERM)
            returned.set()

    thread = threading.Thread(target=main_thread_inside_the_listener, daemon=True)
    thread.start()
    assert returned.wait(5), "the handler waited for a lock its own thread holds"
    thread.join(5)
    wait_until(lambda: worker.stopping, timeout=5)
    assert events == ["stopping"]


def test_a_second_signal_aborts_even_before_the_first_stop_has_run() -> None:
    aborted = threading.Event()
    gate = threading.Event()
    worker = _worker(lambda event: gate.wait(5), abort=aborted.set)
    worker._on_signal(signal.SIGTERM)  # its stop waits on the gate
    worker._on_signal(signal.SIGTERM)
    assert aborted.is_set()
    gate.set()


@pytest.mark.django_db(transaction=True)
def test_a_sigterm_the_kernel_gives_another_thread_stops_the_worker_at_once() -> None:
    """CPython runs a signal handler on the main thread only, and a SIGTERM delivered to
    another thread does not wake a main thread waiting with no timeout: the worker went on
    for as long as its running receiver did (120 s in the health-probe test under load)."""
    from spanner_queues.worker import Worker
    from tests.workerapp import receivers
    from tests.workerapp.models import WorkItems

    hang = receivers.HANGS.setdefault("sigterm-elsewhere", threading.Event())
    WorkItems.send(payload={"hang": "sigterm-elsewhere"})
    worker = Worker(["workerapp.WorkItems"], install_signal_handlers=True, poll_interval=0.05)
    seen: list[bool] = []

    def elsewhere() -> None:
        try:
            wait_until(lambda: worker.slots.in_flight > 0, timeout=30)
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # to this thread
            try:
                wait_until(lambda: worker.stopping, timeout=5)
                seen.append(True)
            except BaseException:
                seen.append(False)
        finally:
            hang.set()

    helper = threading.Thread(target=elsewhere, daemon=True)
    helper.start()
    worker.run()  # on the main thread, where the handler is installed
    helper.join(10)
    assert seen == [True]

"""The Prometheus exporter: Spanner's five queue metrics per queue, and the worker's own.

Needs prometheus-client (``pip install 'spanner-queues[metrics]'``; without it, importing this
module raises ``MetricsUnavailable`` naming the extra). Nothing is counted until metrics are
switched on in the process: ``runqueueworker --metrics-port`` does it,
``SPANNER_QUEUES_METRICS["VIEW"] = True`` does it in web processes, or call ``enable()``, which
connects the counters to the verbs' signals (``spanner_queues.signals``); until then the verbs
register no commit hook.

Where each metric is counted (every process exports its own counts; Prometheus adds them up):

- ``spanner_queues_message_send_count_total``: by the process that sends (``send``,
  ``send_many``, ``replace``, the outbox, a retry's or a give-back's re-send, a dead letter),
  when its transaction commits;
- ``spanner_queues_message_ack_count_total``: by the process that acks, when its transaction
  commits (the verbs' ``messages_acked``, the one channel: the worker's own acks send it too);
- ``spanner_queues_lease_expiration_count_total``: by the engine in this process
  (``BaseQueueEngine.lease_expirations``);
- ``spanner_queues_deliver_time_moved_count_total``: deliveries whose ``DeliverTime`` was later
  than their lease's start, by the engine in this process (``BaseQueueEngine.deliver_time_moves``:
  Spanner moves it on a lease, and the queue's failure ledger fails closed);
- ``spanner_queues_buffered_ready_messages``, ``spanner_queues_oldest_unacked_message_age_seconds``
  and ``spanner_queues_queue_messages``: read from the database by ``engine.stats()`` (the
  admin overview's source), at most every ``SAMPLE_INTERVAL_SECONDS``;
- ``spanner_queues_worker_*``: from the events of the worker in this process
  (``WorkerMetrics``, a ``Worker`` listener).

The depth samples a worker stores each interval are the ``Sampler``'s (``sampler.py``).
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse

from spanner_queues.contrib.metrics.conf import MetricsUnavailable, metrics_params
from spanner_queues.engines import engine_for
from spanner_queues.engines.stats import stats_cache
from spanner_queues.exceptions import QueueError, QueueUnavailable
from spanner_queues.message import Message
from spanner_queues.queues import queue_models
from spanner_queues.signals import (
    inbox_duplicates_dropped,
    inbox_pull_failed,
    inbox_pulled,
    messages_acked,
    messages_published,
    messages_sent,
    publish_failed,
    sends_dropped,
)

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry, multiprocess
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
except ImportError:
    raise MetricsUnavailable(
        "spanner_queues metrics need prometheus-client: pip install 'spanner-queues[metrics]'."
    ) from None

if TYPE_CHECKING:
    from spanner_queues.engines.base import BaseQueueEngine, QueueStats
    from spanner_queues.models import Queue
    from spanner_queues.worker import WorkerEvent

logger = logging.getLogger("spanner_queues.contrib.metrics")

__all__ = [
    "METRIC_NAMES",
    "QueueGauges",
    "WorkerMetrics",
    "enable",
    "enabled",
    "gauges",
    "metrics_view",
    "serve",
    "wsgi_app",
]

#: every metric family this module exports (the names Prometheus shows)
METRIC_NAMES = frozenset(
    {
        "spanner_queues_buffered_ready_messages",
        "spanner_queues_oldest_unacked_message_age_seconds",
        "spanner_queues_queue_messages",
        "spanner_queues_message_send_count_total",
        "spanner_queues_message_send_dropped_count_total",
        "spanner_queues_message_ack_count_total",
        "spanner_queues_lease_expiration_count_total",
        "spanner_queues_deliver_time_moved_count_total",
        "spanner_queues_worker_messages_received_total",
        "spanner_queues_worker_messages_total",
        "spanner_queues_worker_receiver_duration_seconds",
        "spanner_queues_worker_commit_messages",
        "spanner_queues_worker_in_flight_messages",
        "spanner_queues_worker_lease_renewals_total",
        "spanner_queues_worker_leases_lost_total",
        "spanner_queues_worker_receive_errors_total",
        "spanner_queues_worker_queue_failing",
        "spanner_queues_pubsub_published_total",
        "spanner_queues_pubsub_relay_lag_seconds",
        "spanner_queues_pubsub_publish_errors_total",
        "spanner_queues_pubsub_inbox_duplicates_dropped_total",
        "spanner_queues_pubsub_inbox_pulls_total",
        "spanner_queues_pubsub_inbox_pull_failures_total",
    }
)

#: worker events counted in ``spanner_queues_worker_messages_total{outcome=...}``
OUTCOMES = (
    "acked",
    "retried",
    "failed",
    "dead_lettered",
    "discarded",
    "timed_out",
    "unmatched",
    "cancelled",
)
#: events after which a started message is no longer in flight (a timed-out receiver may
#: still be running: it is counted once it fails)
_FINISHED = frozenset(
    {*OUTCOMES, "lease_lost", "already_acked", "returned", "crashed"} - {"timed_out"}
)


class _Metrics:
    """The metric objects, created once per process on the default registry."""

    def __init__(self) -> None:
        self._of_verbs()
        self._of_worker()
        self._of_pubsub()
        self.gauges = QueueGauges()
        prometheus_client.REGISTRY.register(_QueueCollector(self.gauges))

    def _of_verbs(self) -> None:
        """The verbs' counters (their signals, on commit)."""
        prom = prometheus_client
        self.send_count = prom.Counter(
            "spanner_queues_message_send_count",
            "Messages sent by this process (counted when the sending transaction commits).",
            ["queue"],
        )
        self.dropped_count = prom.Counter(
            "spanner_queues_message_send_dropped_count",
            "Sends with unique_for this process dropped: the key was sent within the window "
            "(counted when the sending transaction commits).",
            ["queue"],
        )
        self.ack_count = prom.Counter(
            "spanner_queues_message_ack_count",
            "Messages acked by this process (counted when the acking transaction commits).",
            ["queue"],
        )

    def _of_worker(self) -> None:
        """The worker's (its events, ``WorkerMetrics``)."""
        prom = prometheus_client
        self.received = prom.Counter(
            "spanner_queues_worker_messages_received",
            "Messages received (leased) by the worker in this process.",
            ["queue"],
        )
        self.outcomes = prom.Counter(
            "spanner_queues_worker_messages",
            "Messages the worker finished, by outcome: acked, retried, failed (one failed run), "
            "dead_lettered, discarded, timed_out, unmatched, cancelled. A last failed run is "
            "counted as failed and then dead_lettered or discarded; a run past its time limit as "
            "timed_out and failed.",
            ["queue", "outcome"],
        )
        self.duration = prom.Histogram(
            "spanner_queues_worker_receiver_duration_seconds",
            "Run time of receivers (acked, retried or failed runs), per message; each message "
            "of a batch observes its batch's run time.",
            ["queue", "receiver"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )
        self.in_flight = prom.Gauge(
            "spanner_queues_worker_in_flight_messages",
            "Messages whose receiver is running in this process.",
            ["queue"],
            multiprocess_mode="livesum",
        )
        self.commit_messages = prom.Histogram(
            "spanner_queues_worker_commit_messages",
            "Messages acked per commit of the worker's runs: 1 for a message run alone, a "
            "group's size under group commit, a batch's. Commits per message: _count / _sum.",
            ["queue"],
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500),
        )
        self.renewals = prom.Counter(
            "spanner_queues_worker_lease_renewals",
            "Leases the worker renewed.",
            ["queue"],
        )
        self.leases_lost = prom.Counter(
            "spanner_queues_worker_leases_lost",
            "Messages the worker lost its lease on (expired, or taken by another receiver) "
            "before it could ack them.",
            ["queue"],
        )
        self.receive_errors = prom.Counter(
            "spanner_queues_worker_receive_errors",
            "Receives of the queue that raised in the worker in this process (a dropped queue, "
            "a missing grant, the database unreachable); the queue backs off alone.",
            ["queue"],
        )
        self.queue_failing = prom.Gauge(
            "spanner_queues_worker_queue_failing",
            "1 while the worker in this process cannot receive from the queue (its receives "
            "fail in a row, it backs off), 0 once a receive succeeds again.",
            ["queue"],
            multiprocess_mode="livemax",
        )

    def _of_pubsub(self) -> None:
        """The Pub/Sub app's relay and inbox (its signals, ``spanner_queues.signals``)."""
        prom = prometheus_client
        self.published = prom.Counter(
            "spanner_queues_pubsub_published",
            "Messages of a relayed queue that Pub/Sub confirmed.",
            ["queue", "topic"],
        )
        self.relay_lag = prom.Histogram(
            "spanner_queues_pubsub_relay_lag_seconds",
            "Seconds from a relayed message's send (its deliver time where the engine keeps "
            "no send time) to Pub/Sub's confirmation of its publish.",
            ["queue"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600),
        )
        self.publish_errors = prom.Counter(
            "spanner_queues_pubsub_publish_errors",
            "Messages of a relayed queue Pub/Sub did not confirm: refused (dead-lettered) or "
            "failed (given back, published again after the back-off).",
            ["queue", "kind"],
        )
        self.duplicates_dropped = prom.Counter(
            "spanner_queues_pubsub_inbox_duplicates_dropped",
            "Pub/Sub messages an inbox dropped: their event was taken in before.",
            ["queue"],
        )
        self.inbox_pulls = prom.Counter(
            "spanner_queues_pubsub_inbox_pulls",
            "Pulls an inbox's puller made that Pub/Sub answered (with messages or none).",
            ["queue"],
        )
        self.inbox_pull_failures = prom.Counter(
            "spanner_queues_pubsub_inbox_pull_failures",
            "Pulls of an inbox's puller that failed (no credentials, the subscription missing, "
            "Pub/Sub or the database failing), by the error's type; retried after a back-off.",
            ["queue", "error"],
        )


_lock = threading.Lock()
_metrics: _Metrics | None = None


def enable() -> None:
    """Switch metrics on in this process (idempotent): create the metrics on the default
    registry and connect the send and ack counters to the verbs' signals."""
    global _metrics
    with _lock:
        if _metrics is None:
            _metrics = _Metrics()
            messages_sent.connect(_count_sent, dispatch_uid="spanner_queues.contrib.metrics")
            messages_acked.connect(_count_acked, dispatch_uid="spanner_queues.contrib.metrics")
            sends_dropped.connect(_count_dropped, dispatch_uid="spanner_queues.contrib.metrics")
            uid = "spanner_queues.contrib.metrics"
            messages_published.connect(_count_published, dispatch_uid=uid)
            publish_failed.connect(_count_publish_failed, dispatch_uid=uid)
            inbox_duplicates_dropped.connect(_count_duplicates, dispatch_uid=uid)
            inbox_pulled.connect(_count_pulls, dispatch_uid=uid)
            inbox_pull_failed.connect(_count_pull_failures, dispatch_uid=uid)


def enabled() -> bool:
    return _metrics is not None


def _get() -> _Metrics:
    if _metrics is None:
        enable()
    assert _metrics is not None
    return _metrics


def gauges() -> QueueGauges:
    """This process's queue gauges (switching metrics on), which the ``Sampler`` refreshes."""
    return _get().gauges


# --- counted by the verbs (their signals, sent on commit) ------------------------------------
def _count_sent(sender: type[Queue], messages: Sequence[Message], **kwargs: Any) -> None:
    _get().send_count.labels(sender._meta.label).inc(len(messages))


def _count_dropped(sender: type[Queue], messages: Sequence[Message], **kwargs: Any) -> None:
    _get().dropped_count.labels(sender._meta.label).inc(len(messages))


def _count_acked(sender: type[Queue], messages: Sequence[Any], **kwargs: Any) -> None:
    """Every committed ack, whoever made it: a verb, a receiver's own code, the worker's ack of
    a finished message, a ``Retry``'s or a give-back's ack-and-send, a discard (the worker's
    delivery policy sends the signal too); the worker's events count no ack."""
    _get().ack_count.labels(sender._meta.label).inc(len(messages))


# --- counted by the Pub/Sub app (its signals, sent once the work is done) ---------------------
def _count_published(
    sender: type[Queue], messages: Sequence[Message], topic: str, lags: Sequence[float], **kw: Any
) -> None:
    m, label = _get(), sender._meta.label
    m.published.labels(label, topic).inc(len(messages))
    histogram = m.relay_lag.labels(label)
    for lag in lags:
        histogram.observe(lag)


def _count_publish_failed(
    sender: type[Queue], messages: Sequence[Message], refused: bool, **kwargs: Any
) -> None:
    kind = "refused" if refused else "failed"
    _get().publish_errors.labels(sender._meta.label, kind).inc(len(messages))


def _count_duplicates(sender: type[Queue], count: int, **kwargs: Any) -> None:
    _get().duplicates_dropped.labels(sender._meta.label).inc(count)


def _count_pulls(sender: type[Queue], **kwargs: Any) -> None:
    _get().inbox_pulls.labels(sender._meta.label).inc()


def _count_pull_failures(sender: type[Queue], error: BaseException, **kwargs: Any) -> None:
    _get().inbox_pull_failures.labels(sender._meta.label, type(error).__name__).inc()


# --- the worker's events --------------------------------------------------------------------
class WorkerMetrics:
    """A ``Worker`` listener: ``Worker(listeners=[WorkerMetrics()])``. Counts received
    messages, outcomes, receiver run times, messages per commit (group commit), in-flight
    messages, renewed and lost leases, failed receives per queue and whether a queue is failing
    now. Acks and sends are not counted from
    events: the verbs' signals count them, the worker's included (one channel)."""

    def __init__(self) -> None:
        self._m = _get()
        self._lock = threading.Lock()
        self._running: set[tuple[str, tuple]] = set()
        self._lost: set[tuple[str, tuple]] = set()

    def __call__(self, event: WorkerEvent) -> None:
        message = event.message
        if message is None:
            if event.queue is not None and event.name == "receive_failed":
                self._m.receive_errors.labels(event.queue).inc()
                self._m.queue_failing.labels(event.queue).set(1)
            elif event.queue is not None and event.name == "queue_recovered":
                self._m.queue_failing.labels(event.queue).set(0)
            elif event.queue is not None and event.name == "committed" and event.size:
                self._m.commit_messages.labels(event.queue).observe(event.size)
            return
        m, name, queue = self._m, event.name, message.queue
        ident = (queue, message.key)
        if name == "received":
            m.received.labels(queue).inc()
        elif name == "started":
            with self._lock:
                if ident not in self._running:
                    self._running.add(ident)
                    m.in_flight.labels(queue).inc()
        elif name == "renewed":
            m.renewals.labels(queue).inc()
        elif name == "renewal_failed":
            with self._lock:
                self._lost.add(ident)
            m.leases_lost.labels(queue).inc()
        if name in OUTCOMES:
            m.outcomes.labels(queue, name).inc()
        if event.duration is not None and event.receiver and name in ("acked", "retried", "failed"):
            m.duration.labels(queue, event.receiver).observe(event.duration)
        if name in _FINISHED:
            with self._lock:
                if ident in self._running:
                    self._running.discard(ident)
                    m.in_flight.labels(queue).dec()
                counted = ident in self._lost
                self._lost.discard(ident)
            if name == "lease_lost" and not counted:
                m.leases_lost.labels(queue).inc()


# --- gauges read from the database ----------------------------------------------------------
class QueueGauges:
    """The latest ``engine.stats()`` of every declared queue: the admin overview's source."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stats: dict[str, QueueStats] = {}
        self.measured: float | None = None

    def refresh(self, max_age: float | None = None) -> list[QueueStats]:
        """Read ``engine.stats()`` of every declared queue (one query per queue), unless the
        last read is younger than ``max_age`` seconds; a queue this process read (or failed to
        read) within ``max_age`` for another purpose (the worker's summary line) is not read
        again (``engines.stats.stats_cache``). A queue whose read fails keeps no gauge
        (logged); once a database did not answer within the engine's deadline
        (``QueueUnavailable``), its other queues are not asked in this refresh."""

        with self._lock:
            if (
                max_age is not None
                and self.measured is not None
                and time.monotonic() - self.measured < max_age
            ):
                return list(self.stats.values())
            fresh: dict[str, QueueStats] = {}
            unreachable: set[str] = set()  # engine aliases whose database did not answer
            for model in queue_models():
                alias = engine_for(model).alias
                if alias in unreachable:
                    continue  # (one deadline per refresh, not one per queue)
                try:
                    fresh[model._meta.label] = stats_cache.get(model, max_age=max_age)
                except (DatabaseError, QueueError) as exc:
                    if isinstance(exc, QueueUnavailable):
                        unreachable.add(alias)
                    logger.warning("queue metrics: stats of %s failed: %s", model._meta.label, exc)
            self.stats = fresh
            self.measured = time.monotonic()
            return list(fresh.values())


class _QueueCollector:
    """Yields the gauges of ``QueueGauges`` and the engines' lease expirations at scrape time
    (no database read: the gauges are refreshed by the sampler or the view)."""

    def __init__(self, gauges: QueueGauges) -> None:
        self.gauges = gauges

    def describe(self) -> list[Any]:
        return []  # (not described up front: collect() reads the registry of queues)

    def collect(self) -> Iterator[Any]:
        ready = GaugeMetricFamily(
            "spanner_queues_buffered_ready_messages",
            "Messages due and not leased (native queues: due, leased or not), read from the "
            "database.",
            labels=["queue"],
        )
        oldest = GaugeMetricFamily(
            "spanner_queues_oldest_unacked_message_age_seconds",
            "Age of the oldest message in the queue (table engine: from its send time; native: "
            "from its DeliverTime), 0 when empty; read from the database.",
            labels=["queue"],
        )
        by_state = GaugeMetricFamily(
            "spanner_queues_queue_messages",
            "Messages in the queue by state (total, ready, scheduled, leased), read from the "
            "database as the admin overview shows them.",
            labels=["queue", "state"],
        )
        for stats in self.gauges.stats.values():
            ready.add_metric([stats.queue], stats.ready)
            age = stats.oldest_age
            oldest.add_metric([stats.queue], age.total_seconds() if age is not None else 0.0)
            for state in ("total", "ready", "scheduled", "leased"):
                by_state.add_metric([stats.queue, state], getattr(stats, state))
        expired = _engine_counter(
            "spanner_queues_lease_expiration_count",
            "Leases that ran out without an ack or release, as the engine in this process saw "
            "them (table engine: counted when the message is received again).",
            lambda engine, model: engine.lease_expirations(model),
        )
        moved = _engine_counter(
            "spanner_queues_deliver_time_moved_count",
            "Deliveries whose DeliverTime was later than their lease's start, as the engine in "
            "this process saw them: Spanner moves DeliverTime on a lease, and the failure "
            "ledger of the queue fails closed (0 while it is kept).",
            lambda engine, model: engine.deliver_time_moves(model),
        )
        yield from (ready, oldest, by_state, expired, moved)


def _engine_counter(
    name: str, text: str, count: Callable[[BaseQueueEngine, type[Queue]], int]
) -> CounterMetricFamily:
    """A counter by queue of what each declared queue's engine counted in this process."""
    family = CounterMetricFamily(name, text, labels=["queue"])
    for model in queue_models():
        try:
            family.add_metric([model._meta.label], count(engine_for(model), model))
        except QueueError:
            continue
    return family


def serve(port: int, addr: str = "127.0.0.1") -> tuple[Any, int]:
    """Serve the default registry at ``http://addr:port/metrics`` from a daemon thread;
    port 0 picks a free port. Returns the server and the port it listens on."""
    enable()
    server, _thread = prometheus_client.start_http_server(port, addr=addr)
    return server, server.server_port


def wsgi_app() -> Any:
    """The default registry's exposition as a WSGI app (metrics switched on), for a server
    that serves more than ``/metrics`` (``runqueueworker``: the health probes too)."""
    enable()
    return prometheus_client.make_wsgi_app()


# --- the view for web processes -------------------------------------------------------------
def _authorized(request: HttpRequest, token: str | None) -> bool:
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header[len("Bearer ") :].encode(), token.encode())
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text of this process: the queue gauges (read from the database at most
    every ``SAMPLE_INTERVAL_SECONDS``) and this process's send and ack counts.

    404 unless ``SPANNER_QUEUES_METRICS["VIEW"]``; 403 unless the request carries
    ``Authorization: Bearer <TOKEN>`` or comes from an active staff user."""

    params = metrics_params()
    if not params.view:
        raise Http404("Metrics are off (SPANNER_QUEUES_METRICS['VIEW']).")
    if not _authorized(request, params.token):
        return HttpResponse("Forbidden", status=403, content_type="text/plain")
    metrics = _get()
    metrics.gauges.refresh(max_age=params.sample_interval)
    registry = prometheus_client.REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # several web processes: add them up
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(_QueueCollector(metrics.gauges))
    return HttpResponse(
        prometheus_client.generate_latest(registry),
        content_type=prometheus_client.CONTENT_TYPE_LATEST,
    )


def metric_names_in(text: str) -> Iterable[str]:
    """Metric family names (``# TYPE`` lines) in Prometheus text; for tests and docs."""
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            yield f"{name}_total" if kind == "counter" and not name.endswith("_total") else name

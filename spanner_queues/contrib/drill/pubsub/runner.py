"""The fault drill's Pub/Sub mode (``queuedrill --pubsub``): two services on this project's
database. Service A's outbox ``DrillEvent`` is relayed to the topic ``TOPIC`` by relay workers;
service B's inbox workers pull the subscription ``SUBSCRIPTION`` into ``DrillInbox``, whose
receiver writes the event's ``DrillEffect`` row. Both kinds are real ``runqueueworker``
processes, killed (SIGKILL, or SIGTERM with ``--signal``) on the drill's schedule and replaced.

Guarantees of the measurement, beside the queue mode's (lost, handled twice, drained):

- *drained*: both queues are empty and every event sent has an effect row;
- *settled*: the workers keep running until the subscription's ack deadline has passed since the
  last inbox worker was disrupted (killed, stopped, or under an abort: ``--abort-command``,
  e.g. the Pub/Sub emulator stopped for a few seconds, loses the answers of the pulls under
  way), so that every message it pulled and never acked came back (and was dropped as a
  duplicate or taken in);
- *left on the subscription*: after the workers stopped the drill pulls the subscription itself
  until a pull comes back empty; an event it takes in (not a duplicate) was left in Pub/Sub,
  and fails the drill, as does a message left in either queue or in the dead-letter queue;
- *duplicates dropped* and *published*: counted by the workers (``receivers.MARKER`` lines in
  their logs, written as the inbox drops copies and the relay's publishes are confirmed) plus
  the drill's closing pull; so are the faults they felt, *publish failures* (messages of relay
  runs Pub/Sub did not confirm, given back) and *pull failures*. A count written by a worker
  SIGKILLed a moment later can be missing: they are at least these figures, and do not decide
  the verdict.

``OrderedPubSubDrill`` (``--pubsub --ordered``) runs the ordered drill's numbered streams
through ordered queues: ``DrillOrderedEvent`` (``ordered_by`` the stream) relayed with the
stream as the Pub/Sub ordering key, a subscription with message ordering on, and the ordered
inbox ``DrillOrderedInbox``, whose receiver records how far its stream had got; each stream's
sequence is checked as the inbox's receiver saw it (no gap, no inversion, no double).
"""

from __future__ import annotations

import os
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import google.auth
from google.api_core import exceptions as google_exceptions
from google.cloud.pubsub_v1 import PublisherClient, SubscriberClient

from spanner_queues.contrib.drill.models import DrillEffect
from spanner_queues.contrib.drill.pubsub.models import (
    DrillEvent,
    DrillEventDead,
    DrillInbox,
    DrillOrderedEvent,
    DrillOrderedEventDead,
    DrillOrderedInbox,
)
from spanner_queues.contrib.drill.pubsub.receivers import MARKER
from spanner_queues.contrib.drill.runner import Drill, DrillError, DrillOptions, OrderedDrill
from spanner_queues.contrib.pubsub.conf import project_id, pubsub_params, resource_path
from spanner_queues.contrib.pubsub.inbox import InboxPuller
from spanner_queues.engines import engine_for
from spanner_queues.engines.base import QueueStats
from spanner_queues.exceptions import QueueConfigurationError
from spanner_queues.monitoring import QueueDepthSample
from spanner_queues.options import queue_options

if TYPE_CHECKING:
    from collections.abc import Callable

    from spanner_queues.models import Queue

#: ack deadline of the subscription the drill creates (Pub/Sub's shortest)
ACK_DEADLINE_SECONDS = 10
#: seconds past the ack deadline the drill waits for redeliveries to be pulled
SETTLE_MARGIN = 2.0
#: pulls of the drill's closing check at most (each takes up to PULL_MAX_MESSAGES)
CLOSING_PULLS = 1000


def pubsub_target() -> str:
    """Where Pub/Sub is: ``emulator at HOST`` (``PUBSUB_EMULATOR_HOST``) or ``Google Cloud
    Pub/Sub`` (a project and credentials); ``DrillError`` saying what to set when neither."""
    host = os.environ.get("PUBSUB_EMULATOR_HOST")
    try:
        project = project_id()
    except QueueConfigurationError as exc:  # SPANNER_QUEUES_PUBSUB is invalid (E301)
        raise DrillError(str(exc)) from exc
    needs = (
        "the Pub/Sub mode needs the Pub/Sub emulator (PUBSUB_EMULATOR_HOST=host:port, e.g. "
        "from `gcloud beta emulators pubsub start`) or real Pub/Sub (credentials: gcloud auth "
        "application-default login)"
    )
    if project is None:
        raise DrillError(
            f"{needs}, and a project: SPANNER_QUEUES_PUBSUB = {{'PROJECT': ...}} or "
            "GOOGLE_CLOUD_PROJECT"
        )
    if host:
        return f"emulator at {host}"
    try:
        google.auth.default()
    except Exception as exc:
        raise DrillError(
            f"{needs}: PUBSUB_EMULATOR_HOST is not set and Google credentials are not found "
            f"({type(exc).__name__})"
        ) from exc
    return "Google Cloud Pub/Sub"


class PubSubDrill(Drill):
    """One run of the Pub/Sub mode (``run()`` once); see the module docstring."""

    queue: ClassVar[type[Queue]] = DrillEvent
    mode: ClassVar[str] = "pubsub"
    #: service B's inbox queue, and the dead-letter queue of service A's outbox (``queue``)
    inbox: ClassVar[type[Queue]] = DrillInbox
    dead: ClassVar[type[Queue]] = DrillEventDead
    #: whether the subscription must have message ordering on (made so when the drill makes it)
    message_ordering: ClassVar[bool] = False

    def __init__(
        self,
        options: DrillOptions,
        report_dir: Path,
        *,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        target = pubsub_target()  # before anything is written
        super().__init__(options, report_dir, log=log)
        if engine_for(self.inbox).database != self.alias:
            raise DrillError("the drill's outbox and inbox queues must share a database")
        params = pubsub_params()
        self.topic = resource_path("topics", str(queue_options(self.queue).pubsub_topic), params)
        self.subscription = resource_path(
            "subscriptions", str(queue_options(self.inbox).pubsub_subscription), params
        )
        self.ack_deadline = float(ACK_DEADLINE_SECONDS)
        self._dead_at_start = 0
        self.closing_taken_in = 0
        self.closing_duplicates = 0
        result = self.result
        result.queue = f"{self.queue._meta.label} -> Pub/Sub -> {self.inbox._meta.label}"
        result.pubsub = {
            "target": target,
            "topic": self.topic,
            "subscription": self.subscription,
        }

    # --- the hooks ----------------------------------------------------------------------------
    def _depth_now(self) -> int:
        return sum(engine_for(q).stats(q).total for q in (self.queue, self.inbox))

    def _prepare(self) -> None:
        """The topic and subscription, made when missing (the drill's own; the subscription
        with message ordering on where ``message_ordering``, which a subscription found must
        have too); the subscription's ack deadline; the dead-letter queue's depth at the
        start."""
        publisher, subscriber = PublisherClient(), SubscriberClient()
        try:
            try:
                publisher.create_topic(name=self.topic)
                self._event("pubsub", f"created topic {self.topic}")
            except google_exceptions.AlreadyExists:
                pass
            try:
                subscriber.create_subscription(
                    request={
                        "name": self.subscription,
                        "topic": self.topic,
                        "ack_deadline_seconds": ACK_DEADLINE_SECONDS,
                        "enable_message_ordering": self.message_ordering,
                    }
                )
                self._event("pubsub", f"created subscription {self.subscription}")
            except google_exceptions.AlreadyExists:
                pass
            found = subscriber.get_subscription(subscription=self.subscription)
        except google_exceptions.GoogleAPICallError as exc:
            raise DrillError(
                f"cannot reach or prepare Pub/Sub ({self.result.pubsub['target']}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        finally:
            subscriber.close()
        if found.topic != self.topic:
            raise DrillError(
                f"subscription {self.subscription} is on {found.topic}, not on {self.topic}"
            )
        if self.message_ordering and not found.enable_message_ordering:
            raise DrillError(
                f"subscription {self.subscription} has message ordering off: Pub/Sub would "
                "deliver each stream out of order (delete it: the drill makes it with ordering "
                "on)"
            )
        self.ack_deadline = float(found.ack_deadline_seconds or ACK_DEADLINE_SECONDS)
        self._dead_at_start = engine_for(self.dead).stats(self.dead).total
        self.result.environment["pubsub_client"] = _version("google-cloud-pubsub")
        self.result.environment["pubsub_server"] = self.result.pubsub["target"]

    def _roles(self) -> tuple[str, ...]:
        return ("relay", "inbox")

    def _queue_args(self, role: str) -> list[str]:
        return [(self.queue if role == "relay" else self.inbox)._meta.label]

    def _sample(self) -> QueueStats | None:
        """The two queues' depths, summed into one sample (the chart's line)."""
        with self._db():
            a = engine_for(self.queue).stats(self.queue)
            b = engine_for(self.inbox).stats(self.inbox)
            stats = QueueStats(
                queue=self.result.queue,
                total=a.total + b.total,
                ready=a.ready + b.ready,
                scheduled=a.scheduled + b.scheduled,
                leased=a.leased + b.leased,
                oldest_send_time=min(
                    (t for t in (a.oldest_send_time, b.oldest_send_time) if t is not None),
                    default=None,
                ),
                max_attempts=None,
                measured_at=max(a.measured_at, b.measured_at),
            )
            self.result.samples.append(QueueDepthSample.from_stats(stats))
            return stats
        return None

    def _drained(self, stats: QueueStats | None) -> bool:
        """Both queues empty and every event's effect written (an event can be in Pub/Sub
        while both queues are empty)."""
        if stats is None or stats.total:
            return False
        with self._db():
            done = (
                DrillEffect.objects.using(self.alias)
                .filter(run=self.run_id)
                .values("key")
                .distinct()
                .count()
            )
            return done >= self.result.sent
        return False

    def _abort(self) -> None:
        """An abort, then an inbox disruption: a pull under way in an outage (Pub/Sub stopped,
        its answer lost) leaves its messages unacked until the ack deadline."""
        super()._abort()
        self.disrupted["inbox"] = time.monotonic()

    def _settle(self) -> None:
        """Keep the workers running until the ack deadline passed since the last inbox
        disruption: what a killed inbox worker pulled and never acked has come back."""
        last = self.disrupted.get("inbox")
        if last is None:
            return
        until = last + self.ack_deadline + SETTLE_MARGIN
        while time.monotonic() < until and self._elapsed() < self.options.timeout:
            self._reap(self._handled_before)
            self._sample()
            time.sleep(min(self.options.sample_interval, max(0.0, until - time.monotonic())))
        self._event("settled", f"{self.ack_deadline:g} s ack deadline past the last inbox stop")

    def _after_workers(self) -> None:
        """The closing pull: the subscription, pulled by the drill until a pull is empty."""
        puller = InboxPuller(self.inbox)
        subscriber = SubscriberClient()
        try:
            for _ in range(CLOSING_PULLS):
                if not puller.pull_once(subscriber):
                    break
        finally:
            subscriber.close()
        self.closing_taken_in, self.closing_duplicates = puller.taken_in, puller.duplicates
        self._event(
            "pulled",
            f"closing pull: {puller.taken_in} taken in, {puller.duplicates} duplicates dropped",
        )

    def _count(self) -> None:
        super()._count()
        result = self.result
        counted = worker_counts(result.worker_logs)
        result.published = counted.get("published", 0)
        result.duplicates_dropped = counted.get("duplicates", 0) + self.closing_duplicates
        result.left_on_subscription = self.closing_taken_in
        result.publish_failures = counted.get("publish_failed", 0)
        result.pull_failures = counted.get("pull_failed", 0)
        dead = engine_for(self.dead).stats(self.dead).total
        result.dead_lettered = max(dead - self._dead_at_start, 0)


class OrderedPubSubDrill(OrderedDrill, PubSubDrill):
    """``queuedrill --pubsub --ordered``: the ordered drill's streams (``OrderedDrill``: its
    sends, its keys, its order check) through the relay, Pub/Sub and the ordered inbox
    (``PubSubDrill``: its workers, settling and closing pull); see the module docstring."""

    queue: ClassVar[type[Queue]] = DrillOrderedEvent
    mode: ClassVar[str] = "pubsub"
    inbox: ClassVar[type[Queue]] = DrillOrderedInbox
    dead: ClassVar[type[Queue]] = DrillOrderedEventDead
    message_ordering: ClassVar[bool] = True


def worker_counts(logs: list[Path]) -> dict[str, int]:
    """The ``MARKER`` counts in the workers' logs, summed by name."""
    counts: dict[str, int] = {}
    for log in logs:
        try:
            text = log.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == MARKER and parts[2].isdigit():
                counts[parts[1]] = counts.get(parts[1], 0) + int(parts[2])
    return counts


def _version(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "unknown"

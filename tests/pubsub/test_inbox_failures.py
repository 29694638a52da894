"""An inbox whose puller cannot pull says so: the worker's ``/readyz`` answers 503 with the
reason, the puller keeps trying with back-off (a client without credentials included), logs
once per failure episode (and once when it ends), and the metrics app counts pulls and failed
pulls (before: the thread died at start without credentials while ``/readyz`` said 200, and a
deleted subscription gave one warning and then silence)."""

from __future__ import annotations

import logging
import re
import signal
import urllib.error
import urllib.request
from typing import Any

import pytest
from google.cloud import pubsub_v1
from prometheus_client import REGISTRY

from spanner_queues.contrib import metrics
from spanner_queues.contrib.pubsub.inbox import InboxPuller
from tests.children import Child
from tests.conftest import wait_until
from tests.pubsubapp.models import BillingInbox

pytestmark = pytest.mark.django_db(transaction=True)
LABEL = "pubsubapp.BillingInbox"


def probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.process
def test_an_inbox_without_credentials_is_unready_and_says_why(child_env, tmp_path) -> None:
    env = {k: v for k, v in child_env.items() if k != "PUBSUB_EMULATOR_HOST"}
    env["GOOGLE_APPLICATION_CREDENTIALS"] = str(tmp_path / "missing.json")
    worker = Child(env, tmp_path, LABEL, "--health-port", "0", "-v1", name="inbox")
    try:
        found: list[int] = []

        def port() -> bool:
            match = re.search(r"health on http://127\.0\.0\.1:(\d+)/livez", worker.output())
            found[:] = [int(match.group(1))] if match else []
            return bool(found) or worker.proc.poll() is not None

        wait_until(port, 60)
        assert found, worker.output()
        answers: list[tuple[int, str]] = []
        wait_until(
            lambda: answers.append(probe(found[0], "/readyz")) or "pull" in answers[-1][1], 60
        )
        status, text = answers[-1]
        assert status == 503, text
        assert f"inbox {LABEL}: cannot pull" in text and "DefaultCredentialsError" in text, text
        assert probe(found[0], "/livez")[0] == 200  # a restart would not bring credentials
    finally:
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.output()
    assert worker.output().count("DefaultCredentialsError") >= 1


def test_a_deleted_subscription_is_retried_logged_per_episode_and_counted(
    pubsub: Any, caplog: pytest.LogCaptureFixture
) -> None:
    metrics.enable()
    pulls = value("spanner_queues_pubsub_inbox_pulls_total", queue=LABEL)
    failed = value("spanner_queues_pubsub_inbox_pull_failures_total", queue=LABEL, error="NotFound")
    subscriber = pubsub_v1.SubscriberClient()
    subscriber.delete_subscription(subscription=pubsub.subscription)
    puller = InboxPuller(BillingInbox)
    caplog.set_level(logging.INFO, logger="spanner_queues.pubsub")
    puller.start()
    try:
        wait_until(lambda: puller.pull_failures >= 3, 60)
        [problem] = puller.problems()
        assert problem.startswith(f"inbox {LABEL}: cannot pull {pubsub.subscription}")
        assert "NotFound" in problem
        assert (
            value("spanner_queues_pubsub_inbox_pull_failures_total", queue=LABEL, error="NotFound")
            >= failed + 3
        )
        subscriber.create_subscription(name=pubsub.subscription, topic=pubsub.topic)
        wait_until(lambda: not puller.problems(), 60)
        wait_until(
            lambda: value("spanner_queues_pubsub_inbox_pulls_total", queue=LABEL) > pulls, 30
        )
    finally:
        puller.stop()
        subscriber.close()
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions.count("pull_failed") == 1  # one episode: logged once as it starts
    assert actions.count("pull_recovered") == 1
    assert [r.exc_info is not None for r in caplog.records if r.action == "pull_failed"] == [True]

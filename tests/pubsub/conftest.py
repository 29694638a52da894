"""Fixtures of the Pub/Sub app's tests: one Google Pub/Sub emulator for the session (a missing
emulator fails under CI and skips elsewhere), and a project of its own for each test, with the
topic ``orders`` and the subscriptions ``orders-billing`` and ``orders-billing-ordered`` (the
ordered inbox's) made by ``createpubsubresources``.

Collected only under ``tests.settings_pubsub`` and ``tests.settings_pubsub_native``."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

SETTINGS = os.environ.get("DJANGO_SETTINGS_MODULE", "")
if SETTINGS not in ("tests.settings_pubsub", "tests.settings_pubsub_native"):
    collect_ignore_glob = ["test_*.py"]

_projects = itertools.count()


@pytest.fixture(scope="session")
def pubsub_emulator() -> Iterator[Any]:
    from spanner_queues.testing.pubsub import PubSubEmulator, PubSubEmulatorNotFound

    try:
        emulator = PubSubEmulator()
    except PubSubEmulatorNotFound as exc:
        if os.environ.get("CI"):
            raise  # CI must run these tests: fail loudly
        pytest.skip(str(exc))
    previous = os.environ.get("PUBSUB_EMULATOR_HOST")
    os.environ["PUBSUB_EMULATOR_HOST"] = emulator.host
    yield emulator
    if previous is None:
        os.environ.pop("PUBSUB_EMULATOR_HOST", None)
    else:
        os.environ["PUBSUB_EMULATOR_HOST"] = previous
    emulator.stop()


@dataclass
class PubSubProject:
    """A project of its own on the emulator, with ``orders`` and ``orders-billing``."""

    name: str
    host: str

    @property
    def topic(self) -> str:
        return f"projects/{self.name}/topics/orders"

    @property
    def subscription(self) -> str:
        return f"projects/{self.name}/subscriptions/orders-billing"

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` (``child_env``) for a child process of this project."""
        return {**base, "PUBSUB_EMULATOR_HOST": self.host, "SQ_PUBSUB_PROJECT": self.name}

    def pull(self, max_messages: int = 100) -> list[Any]:
        """Pull and ack what the subscription holds now (a test reading what was relayed)."""
        from google.cloud import pubsub_v1

        subscriber = pubsub_v1.SubscriberClient()
        try:
            got = subscriber.pull(
                subscription=self.subscription, max_messages=max_messages, timeout=5, retry=None
            ).received_messages
            if got:
                subscriber.acknowledge(
                    subscription=self.subscription, ack_ids=[r.ack_id for r in got]
                )
            return [r.message for r in got]
        finally:
            subscriber.close()


@pytest.fixture
def pubsub(pubsub_emulator: Any, settings: Any) -> PubSubProject:
    from django.core.management import call_command

    project = PubSubProject(f"sq-{os.getpid()}-{next(_projects)}", pubsub_emulator.host)
    settings.SPANNER_QUEUES_PUBSUB = {**settings.SPANNER_QUEUES_PUBSUB, "PROJECT": project.name}
    call_command(
        "createpubsubresources",
        "--topic",
        "orders-billing=orders",
        "--topic",
        "orders-billing-ordered=orders",
        "--topic",
        "sq-drill-inbox=sq-drill-events",  # the fault drill's (queuedrill --pubsub)
        "--topic",
        "sq-drill-ordered-inbox=sq-drill-ordered-events",  # --pubsub --ordered
        "--ack-deadline",
        "10",
        stdout=open(os.devnull, "w"),
    )
    return project


@pytest.fixture(autouse=True)
def relay_episodes(monkeypatch: Any) -> None:
    """The relay's failure episodes (per queue, in this process) are each test's own."""
    # (the relay imports the verbs, which need the app registry: not at this module's import)
    from spanner_queues.contrib.pubsub import relay

    monkeypatch.setattr(relay, "_episodes", {}, raising=False)

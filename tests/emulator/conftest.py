"""Tests of the queue-aware emulator front with Google's own client and documented statements.

Collected only under ``tests.settings_spanner_native``, whose import starts the front (its
address is ``SPANNER_EMULATOR_HOST``); each test gets a database of its own on it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest

if os.environ.get("DJANGO_SETTINGS_MODULE") != "tests.settings_spanner_native":
    collect_ignore_glob = ["test_*.py"]

_names = itertools.count()

USERS = "CREATE TABLE Users (UserId INT64 NOT NULL, Name STRING(MAX)) PRIMARY KEY (UserId)"
# Google's examples, as published (queues-using, the Java integration test, the Python sample).
USER_TASKS = (
    "CREATE QUEUE UserTasks (\n  UserId INT64 NOT NULL, MessageId STRING(36) NOT NULL, "
    "Payload BYTES(MAX) NOT NULL\n) PRIMARY KEY (UserId, MessageId), INTERLEAVE IN PARENT "
    "Users ON DELETE CASCADE"
)
Q1 = (
    "CREATE QUEUE Q1 (Id INT64 NOT NULL, Payload BYTES(MAX) NOT NULL) PRIMARY KEY (Id), "
    "OPTIONS (receive_mode = 'PULL')"
)
SAMPLE_QUEUE = (
    "CREATE QUEUE SampleQueue (Id INT64 NOT NULL, Payload STRING(MAX) NOT NULL) PRIMARY KEY (Id)"
)


#: the instance on a module's own front (``in_process_front``)
IN_PROCESS = "in-process"


@pytest.fixture(scope="module")
def in_process_front() -> Iterator[Any]:
    """A front of the module's own, in this process (``QueueEmulator``), so a test can count
    what it does; ``SPANNER_EMULATOR_HOST`` names it meanwhile, its instance ``IN_PROCESS``."""
    from spanner_queues_emulator import QueueEmulator, ensure_instance

    with pytest.MonkeyPatch.context() as patch, QueueEmulator() as emulator:
        patch.setenv("SPANNER_EMULATOR_HOST", emulator.host)
        ensure_instance(IN_PROCESS)
        yield emulator


@pytest.fixture(scope="session")
def spanner_client() -> Any:
    from google.cloud import spanner

    assert os.environ.get("SPANNER_EMULATOR_HOST"), "the front must be running"
    return spanner.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "test-project"))


@pytest.fixture
def database(spanner_client: Any) -> Iterator[Any]:
    """A fresh database with Google's example tables and queues."""
    from django.conf import settings

    instance = spanner_client.instance(settings.INSTANCE)
    db = instance.database(
        f"fq{os.getpid()}x{next(_names)}", ddl_statements=[USERS, USER_TASKS, Q1, SAMPLE_QUEUE]
    )
    db.create().result(60)
    yield db
    db.drop()


@pytest.fixture
def control() -> Iterator[Any]:
    """The front's control API (``spanner_queues_emulator.faults``), recording; its faults and
    record are cleared afterwards."""
    from spanner_queues_emulator.faults import FrontControl

    front = FrontControl(os.environ["SPANNER_EMULATOR_HOST"])
    front.record(True)
    try:
        yield front
    finally:
        front.record(False)
        front.clear()
        front.close()

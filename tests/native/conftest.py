"""Native-engine tests run only under ``tests.settings_native`` (their own pytest run in
``bin/test``); the wire tests need the in-process fake, the conformance cases run on the fake
or, with ``SPANNER_QUEUES_REAL_DATABASE``, on real Spanner."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

NATIVE = os.environ.get("DJANGO_SETTINGS_MODULE") == "tests.settings_native"
REAL = bool(os.environ.get("SPANNER_QUEUES_REAL_DATABASE"))

#: bin/test-real-spanner: of this directory, only the check that the real instance is in use
REAL_INSTANCE = os.environ.get("DJANGO_SETTINGS_MODULE") == "tests.settings_real_spanner"

if REAL_INSTANCE:
    collect_ignore_glob = ["test_[!r]*.py", "test_review*.py"]
elif not NATIVE:
    collect_ignore_glob = ["test_*.py"]
elif REAL:
    collect_ignore_glob = ["test_wire*.py"]  # they assert on the fake's recorded requests


@pytest.fixture
def fake() -> Any:
    from django.conf import settings

    return settings.FAKE_SPANNER


@pytest.fixture(autouse=True, scope="session")
def _stop_fake_at_exit() -> Iterator[None]:
    yield
    from django.conf import settings

    from spanner_queues.engines import engines

    if settings.FAKE_SPANNER is not None:
        settings.FAKE_SPANNER.streams_end.set()
        engines["default"].stop_receiving(wait=5)
        settings.FAKE_SPANNER.stop()


@pytest.fixture(autouse=True)
def _native_isolation(django_db_blocker: Any) -> Iterator[None]:
    """Each test starts with no receive stream, no recorded request and empty queues."""
    from django.conf import settings

    from spanner_queues.engines import engines

    fake = settings.FAKE_SPANNER
    if fake is not None:
        fake.clear()
    yield
    engine = engines["default"]
    if fake is not None:
        fake.streams_end.set()  # end RECEIVE streams so the receiver threads finish now
        engine.stop_receiving(wait=5)
        fake.streams_end.clear()
        fake.lease_seconds = 10.0
        fake.resume_tokens = True
        fake.clear()
    else:  # real Spanner: a stream ends at max_duration; wait, or it leases the next test's
        engine.stop_receiving(wait=engine.max_duration_seconds + 5)
    from django.db import connection

    from spanner_queues.registry import queue_models

    if connection.settings_dict["NAME"] == connection.creation._get_test_db_name():
        with django_db_blocker.unblock():
            for model in queue_models():
                engine.purge(model)
        if fake is not None:
            for db in fake.databases.values():
                db.leases.clear()

"""The quick flush after a transactional test (``_QuickFlush``, ``tests/conftest.py``) on the
Spanner emulator, which runs one read-write transaction at a time."""

from __future__ import annotations

import pytest


@pytest.mark.django_db(transaction=True)
def test_the_quick_flush_waits_out_another_transaction_on_the_emulator() -> None:
    """The emulator runs one read-write transaction at a time and aborts a newcomer four times
    in five (platform notes): a worker process's last transaction, still open as its process
    ends, made the flush after ``tests/metrics/test_process.py`` fail a CI shard with
    ``Aborted``. The flush runs again, as a transaction that lost a race does."""
    from django.db import connection
    from google.cloud.spanner_v1 import param_types

    from tests.conftest import _QuickFlush
    from tests.workerapp.models import WorkLog

    if connection.vendor != "spanner":
        pytest.skip("the emulator's one transaction at a time")
    flush = _QuickFlush("default")
    connection.ensure_connection()
    database = connection.connection.database
    WorkLog.objects.create(key="k")
    session = database.session()
    session.create()
    try:
        held = session.transaction()
        held.begin()
        held.execute_update(
            "UPDATE workerapp_worklog SET key = key WHERE key = @k",
            params={"k": "k"},
            param_types={"k": param_types.STRING},
        )
        flush.flush()  # the held transaction is never committed (16 s of the client's back-off)
    finally:
        session.delete()
    assert not WorkLog.objects.exists()

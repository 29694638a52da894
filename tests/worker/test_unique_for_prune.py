"""The worker prunes the ``unique_for`` ledger a claim of its process marked due, outside any
transaction, before it receives."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from spanner_queues import uniqueness
from spanner_queues.engines import engine_for
from spanner_queues.uniqueness import SentKey
from spanner_queues.worker import Worker
from tests.workerapp.models import WorkItems

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_prunes_ended_windows_a_claim_marked_due(
    make_worker: Callable[..., Worker],
) -> None:
    db = engine_for(WorkItems).database
    SentKey.objects.create(pk="e" * 64, queue="x.Y", window_ends_at=timezone.now())
    uniqueness._pruned.pop(db, None)  # as in a process that has not pruned yet
    with transaction.atomic(using=db):  # a claim in a transaction: marked due, not pruned
        WorkItems.send(id="once", payload={}, unique_for=timedelta(hours=1))
    assert SentKey.objects.filter(pk="e" * 64).exists()
    stats = make_worker(WorkItems, burst=True).run()
    assert stats.processed == 1
    assert list(SentKey.objects.values_list("queue", flat=True)) == [WorkItems._meta.label]

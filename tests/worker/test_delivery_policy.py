"""The engine seam is storage only; the delivery policy (back-off, attempts, giving back,
retry, discard) is the worker's, in one place (``worker.apply.DeliveryPolicy``), with typed
results."""

from __future__ import annotations

import enum
import inspect

import pytest

from spanner_queues import api, clock
from spanner_queues.engines import engine_for
from spanner_queues.engines.base import BaseQueueEngine
from spanner_queues.engines.table import TableQueueEngine
from spanner_queues.worker.apply import DeliveryPolicy, Unstarted
from tests.conftest import wait_until
from tests.workerapp.models import WorkItems

ENGINES: tuple[type[BaseQueueEngine], ...] = (BaseQueueEngine, TableQueueEngine)
try:
    from spanner_queues.engines.native import NativeQueueEngine
except ImportError:  # no `spanner` extra (the Django 6.1 line): the native engine cannot load
    pass
else:
    ENGINES += (NativeQueueEngine,)

#: the policy verbs the seam carried before (issue 21): none is an engine's any more
POLICY = (
    "backoff",
    "exhausted",
    "fail",
    "give_back",
    "return_unstarted",
    "resend",
    "discard",
    "ack_messages",
    "ack_keys",
)


@pytest.mark.engine_independent
@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.__name__)
def test_engines_carry_no_delivery_policy(engine: type[BaseQueueEngine]) -> None:
    assert [name for name in POLICY if hasattr(engine, name)] == []
    assert [name for name in POLICY if not hasattr(DeliveryPolicy, name)] == [
        "ack_messages",
        "ack_keys",
    ]


@pytest.mark.engine_independent
@pytest.mark.parametrize("verb", ["ack_many", "send_many", "requeue", "release", "receive"])
def test_each_storage_verb_has_one_signature_on_every_engine(verb: str) -> None:
    base = inspect.signature(getattr(BaseQueueEngine, verb))
    for engine in ENGINES:
        assert inspect.signature(getattr(engine, verb)) == base, engine.__name__


@pytest.mark.engine_independent
def test_return_unstarted_answers_with_an_enum() -> None:
    assert issubclass(Unstarted, enum.Enum)
    assert inspect.signature(DeliveryPolicy.return_unstarted).return_annotation == "Unstarted"


@pytest.mark.django_db(transaction=True)
@pytest.mark.requires("supports_attempt_count")
def test_return_unstarted_gives_a_first_delivery_back_and_runs_a_later_one() -> None:
    policy = DeliveryPolicy(engine_for(WorkItems))
    sent = WorkItems.send(payload={})
    [first] = wait_until(lambda: api.receive(WorkItems))
    assert first.attempt == 1
    assert policy.return_unstarted(WorkItems, first, using="default") is Unstarted.RETURNED
    [again] = wait_until(lambda: api.receive(WorkItems))
    assert (again.key, again.attempt) == (sent.key, 1)  # no attempt spent
    assert policy.fail(WorkItems, again, RuntimeError("failed"), using="default").attempt == 1
    assert policy.give_back(WorkItems, again, deliver_time=clock.now())
    [later] = wait_until(lambda: api.receive(WorkItems))
    assert later.attempt == 2
    assert policy.return_unstarted(WorkItems, later, using="default") is Unstarted.RUN
    api.ack(later)

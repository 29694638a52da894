"""A Django task enqueued in a span runs in a CONSUMER span of the same trace, child of its send,
when its backend's queue is an envelope queue (``QUEUE_MODELS`` naming
``tests.tracingapp.models.TaskEvents``); the task's own code sees that span."""

from __future__ import annotations

import pytest
from django.db import transaction
from django_tasks import TaskResultStatus
from opentelemetry import trace

from spanner_queues.contrib.tasks.runner import RECEIVER_NAME, connect
from spanner_queues.receivers import ReceiverRegistry
from spanner_queues.worker import Worker
from tests.tasksapp import tasks
from tests.tasksapp.models import Thing

pytestmark = pytest.mark.django_db(transaction=True)

tracer = trace.get_tracer("tests")


def test_a_task_runs_in_the_trace_of_its_enqueue(spans, settings) -> None:
    settings.TASKS = {
        **settings.TASKS,
        "traced": {
            "BACKEND": "spanner_queues.contrib.tasks.QueueBackend",
            "OPTIONS": {"QUEUE_MODELS": {"default": "tracingapp.TaskEvents"}},
        },
    }
    registry = ReceiverRegistry()
    assert "tracingapp.TaskEvents" in connect(registry)
    with tracer.start_as_current_span("request") as request:
        with transaction.atomic():
            result = tasks.make_thing.using(backend="traced").enqueue(num=11)
    Worker(
        ["tracingapp.TaskEvents"], registry=registry, burst=True, install_signal_handlers=False
    ).run()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert list(Thing.objects.values_list("num", flat=True)) == [11]
    [send] = [s for s in spans.get_finished_spans() if s.name == "send tracingapp.TaskEvents"]
    [run] = [s for s in spans.get_finished_spans() if s.name == "process tracingapp.TaskEvents"]
    assert send.context.trace_id == request.get_span_context().trace_id
    assert (run.context.trace_id, run.parent.span_id) == (
        send.context.trace_id,
        send.context.span_id,
    )
    assert run.attributes["messaging.operation.name"] == RECEIVER_NAME

"""One trace from a request through a real ``runqueueworker`` process: the test's span sends
to an envelope queue, a child worker with the tracing app (its SDK exports to a file,
``tests.tracingapp.export``) runs the receiver in a CONSUMER span of the same trace, child of
the send: the context crossed the process boundary in the message. A failing receiver's error
is on its span. Runs on every engine (SQLite, native queues on the front, ...)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry import trace

from tests.children import Child
from tests.tracingapp.models import Events, Ran

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

tracer = trace.get_tracer("tests")


def test_a_request_send_and_the_workers_run_are_one_trace(
    spans, child_env: dict[str, str], tmp_path: Path
) -> None:
    exported = tmp_path / "spans.jsonl"
    with tracer.start_as_current_span("GET /orders/7/pay") as request:
        Events.send(id="ok", payload={"order": 7})
        Events.send(id="bad", payload={"fail": "card declined"})
    [ok_send, bad_send] = [
        s for s in spans.get_finished_spans() if s.name == "send tracingapp.Events"
    ]
    child = Child(
        {**child_env, "SQ_TRACE_FILE": str(exported)},
        tmp_path,
        "tracingapp.Events",
        "--burst",
        "--concurrency",
        "1",
    )
    try:
        assert child.wait() == 0, child.output()
    finally:
        child.kill()
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    runs = {s["attributes"]["messaging.message.id"]: s for s in lines if s["kind"] == "CONSUMER"}
    trace_id = f"{request.get_span_context().trace_id:032x}"

    ok = runs["ok"]
    assert ok["name"] == "process tracingapp.Events"
    assert (ok["trace_id"], ok["parent_id"]) == (trace_id, f"{ok_send.context.span_id:016x}")
    assert ok["status"] == "UNSET"
    [ran] = Ran.objects.all()
    assert json.loads(ran.data)["trace_id"] == trace_id  # current in the receiver's code

    bad = runs["bad"]
    assert (bad["trace_id"], bad["parent_id"]) == (trace_id, f"{bad_send.context.span_id:016x}")
    assert bad["status"] == "ERROR" and "exception" in bad["events"]
    assert bad["attributes"]["error.type"] == "RuntimeError"

"""Receiver registry: declaration, dispatch by key column or payload field, validation."""

from __future__ import annotations

from datetime import timedelta

import pytest

from spanner_queues import receiver
from spanner_queues.message import Message
from spanner_queues.patterns import next_run, window_deliver_time
from spanner_queues.receivers import (
    NoReceiver,
    ReceiverConfigurationError,
    ReceiverRegistry,
    receivers,
)
from tests.workerapp.models import Events, Tasks


def _message(queue: str, key: tuple, names: tuple, payload: bytes = b"") -> Message:
    return Message(queue=queue, key=key, key_names=names, payload=payload, deliver_time=None)


def test_receivers_module_is_autodiscovered() -> None:
    names = {s.name for s in receivers.all()}
    assert "tests.workerapp.receivers.work" in names
    assert set(receivers.by_queue()) >= {"workerapp.WorkItems", "workerapp.Tasks"}


def test_decorator_returns_the_function_unchanged() -> None:
    registry = ReceiverRegistry()

    def handler(message: Message) -> str:
        return "called"

    assert receiver(Events, registry=registry)(handler) is handler
    assert handler(_message("workerapp.Events", ("1",), ("id",))) == "called"
    receiver(Events, registry=registry)(handler)  # registering again replaces it
    assert len(registry) == 1


def test_dispatch_by_key_column_and_payload_field() -> None:
    specs = receivers.for_queue(Tasks)
    email = _message("workerapp.Tasks", ("email", "1"), ("kind", "id"))
    report = _message("workerapp.Tasks", ("report", "2"), ("kind", "id"))
    other = _message("workerapp.Tasks", ("sms", "3"), ("kind", "id"))
    assert receivers.route(specs, email).name.endswith(".send_email")
    assert receivers.route(specs, report).name.endswith(".build_report")
    with pytest.raises(NoReceiver, match="no receiver"):
        receivers.route(specs, other)

    specs = receivers.for_queue(Events)
    signup = _message("workerapp.Events", ("1",), ("id",), b'{"type":"signup"}')
    unknown = _message("workerapp.Events", ("2",), ("id",), b'{"type":"x"}')
    not_json = _message("workerapp.Events", ("3",), ("id",), b"\xff")
    assert receivers.route(specs, signup).name.endswith(".on_signup")
    assert receivers.route(specs, unknown).name.endswith(".on_other_event")  # the catch-all
    assert receivers.route(specs, not_json).name.endswith(".on_other_event")


@pytest.mark.parametrize(
    ("declare", "error"),
    [
        (lambda r: [receiver("nope.Missing", registry=r)(print)], "not a declared queue"),
        (
            lambda r: [
                receiver(Events, registry=r)(lambda m: None),
                receiver(Events, registry=r)(print),
            ],
            "2 receivers without match",
        ),
        (
            lambda r: [
                receiver(Events, match={"type": "a"}, registry=r)(lambda m: None),
                receiver(Events, match={"type": "a"}, registry=r)(print),
            ],
            "same match",
        ),
        (
            lambda r: [
                receiver(Events, match={"type": "a"}, batch=True, registry=r)(lambda m: None),
                receiver(Events, registry=r)(print),
            ],
            "mixes batch",
        ),
    ],
)
def test_bad_declarations_are_configuration_errors(declare: object, error: str) -> None:
    registry = ReceiverRegistry()
    declare(registry)  # type: ignore[operator]
    with pytest.raises(ReceiverConfigurationError, match=error):
        registry.by_queue()


def test_max_batch_size_needs_batch() -> None:
    with pytest.raises(ReceiverConfigurationError, match="batch=True"):
        receiver(Events, max_batch_size=5)


def test_window_deliver_time_rounds_up_with_stable_offsets() -> None:
    from datetime import datetime, timezone

    now = datetime(2026, 1, 1, 12, 0, 7, tzinfo=timezone.utc)
    window = timedelta(seconds=10)
    assert window_deliver_time(window, now=now) == datetime(
        2026, 1, 1, 12, 0, 10, tzinfo=timezone.utc
    )
    a = window_deliver_time(window, now=now, entity="user-1")
    assert a == window_deliver_time(window, now=now + timedelta(seconds=2), entity="user-1")
    assert now + timedelta(seconds=3) <= a < now + timedelta(seconds=13)
    offsets = {window_deliver_time(window, now=now, entity=i) for i in range(20)}
    assert len(offsets) > 10  # entities spread over the window


def test_next_run_skips_missed_runs() -> None:
    from datetime import datetime, timezone

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    m = Message(queue="q", key=("a",), key_names=("name",), payload=b"", deliver_time=t0)
    hour = timedelta(hours=1)
    assert next_run(m, hour, now=t0 + timedelta(minutes=1)) == t0 + hour
    assert next_run(m, hour, now=t0 + timedelta(hours=5, minutes=1)) == t0 + 6 * hour

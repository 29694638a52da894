"""Bad input that used to get through (issue 15 #10, #12): each is refused with the library's
own error before anything is written, or is a system-check error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import models
from django.test import override_settings
from django.test.utils import isolate_apps

from spanner_queues import api
from spanner_queues.checks import _check_fields, check_queues
from spanner_queues.exceptions import InvalidArgument, InvalidMessage, PayloadError, QueueError
from spanner_queues.models import Queue
from spanner_queues.worker import Worker
from tests.testapp.models import Jobs, UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


# --- declarations that passed check, makemigrations and migrate ------------------------------
def _ids(model: Any) -> list[str]:
    return sorted(m.id for m in _check_fields(model))


@pytest.mark.engine_independent
@isolate_apps("tests.testapp")
@pytest.mark.parametrize("name", ["lease_token", "payload", "deliver_time", "attempts"])
def test_a_key_field_named_like_a_queue_column_is_an_error(name: str) -> None:
    attrs = {
        "__module__": "tests.testapp.models",
        "other": models.CharField(max_length=8),
        "pk": models.CompositePrimaryKey(name, "other"),
    }
    if name not in ("payload", "deliver_time", "attempts"):
        attrs[name] = models.CharField(max_length=64)
    model = type(f"Bad_{name}", (Queue,), attrs)
    assert "spanner_queues.E010" in _ids(model)


@pytest.mark.engine_independent
@isolate_apps("tests.testapp")
@pytest.mark.parametrize("name", ["delay", "using", "send", "replace"])
def test_a_field_named_like_a_send_argument_or_method_is_an_error(name: str) -> None:
    attrs = {"__module__": "tests.testapp.models", name: models.CharField(max_length=8)}
    attrs["id"] = models.CharField(max_length=8, primary_key=True)
    model = type(f"Bad_{name}", (Queue,), attrs)
    assert _ids(model) == ["spanner_queues.E010"]


@pytest.mark.engine_independent
@isolate_apps("tests.testapp")
def test_queue_columns_redeclared_with_another_type_are_errors() -> None:
    class Retyped(Queue):
        id = models.CharField(max_length=8, primary_key=True)
        payload = models.IntegerField()  # (a TextField is a string payload: payload types)
        deliver_time = models.DateField()

        class Meta:
            app_label = "testapp"

    assert _ids(Retyped) == ["spanner_queues.E011", "spanner_queues.E011"]


@pytest.mark.engine_independent
def test_declared_test_queues_pass() -> None:
    assert _ids(Jobs) == [] and _ids(UserTasks) == []


# --- settings -------------------------------------------------------------------------------
@pytest.mark.engine_independent
@pytest.mark.parametrize(
    "options",
    [
        {"LEASE_SECONDS": timedelta(seconds=-5)},
        {"LEASE_SECONDS": timedelta(0)},
        {"LEASE_SECONDS": float("inf")},
        {"LEASE_SECONDS": True},
        {"BACKOFF": {"MAX_SECONDS": timedelta(0)}},
        {"BACKOFF": {"INITIAL_SECONDS": -1}},
        {"JSON_ENCODER": "no.such.Encoder"},
        {"JSON_ENCODER": dict},
    ],
)
def test_non_positive_durations_and_bad_encoders_are_check_errors(options: dict) -> None:
    with override_settings(SPANNER_QUEUES={"default": {"OPTIONS": options}}):
        assert "spanner_queues.E001" in [m.id for m in check_queues()]


# --- values -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"user_id": 2**70, "message_id": "a"}, InvalidMessage),  # was OverflowError
        ({"user_id": 1.7, "message_id": "a"}, InvalidMessage),  # was stored as 1
        ({"user_id": "1", "message_id": "a"}, InvalidMessage),  # not an int
        ({"user_id": True, "message_id": "a"}, InvalidMessage),
        ({"user_id": 1, "message_id": ["a"]}, InvalidMessage),  # was stored as "['a']"
        ({"user_id": 1, "message_id": 5}, InvalidMessage),
        ({"user_id": 1, "message_id": "a", "payload": "\ud800"}, PayloadError),
        ({"user_id": 1, "message_id": "a", "payload": {"s": "\ud800"}}, PayloadError),
        ({"user_id": 1, "message_id": "a", "delay": timedelta(days=999999999)}, InvalidMessage),
        (
            {"user_id": 1, "message_id": "a", "deliver_time": datetime.max.replace(tzinfo=UTC)},
            InvalidMessage,
        ),
        (
            {
                "user_id": 1,
                "message_id": "a",
                "deliver_time": datetime.min.replace(tzinfo=timezone(timedelta(hours=5))),
            },
            InvalidMessage,
        ),
    ],
)
def test_bad_values_are_the_librarys_errors_and_write_nothing(spec: dict, error: type) -> None:
    with pytest.raises(error):
        UserTasks.send(**spec)
    assert not UserTasks.objects.exists()


def test_send_many_of_non_mappings_is_invalid_message() -> None:
    with pytest.raises(InvalidMessage, match="mapping"):
        api.send_many(Jobs, ["x"])  # type: ignore[list-item]
    assert not Jobs.objects.exists()


@pytest.mark.requires("stores_bookkeeping_fields")  # "burns no attempt" reads the attempts column
@pytest.mark.parametrize(
    "kwargs",
    [
        {"lease": timedelta(seconds=-60)},
        {"lease": timedelta(0)},
        {"lease": 5},
        {"max_messages": "3"},
        {"max_messages": 0},
    ],
)
def test_receive_refuses_bad_arguments_and_burns_no_attempt(kwargs: dict) -> None:
    Jobs.send(id="a", payload="")
    with pytest.raises(InvalidArgument):
        api.receive(Jobs, **kwargs)
    assert Jobs.objects.get(id="a").attempts == 0


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    "kwargs", [{"concurrency": 100000}, {"concurrency": 0}, {"prefetch": "2"}, {"lease": 5}]
)
def test_worker_refuses_bad_arguments_with_a_queue_error(kwargs: dict) -> None:
    with pytest.raises(QueueError):
        Worker(["workerapp.WorkItems"], install_signal_handlers=False, **kwargs)


@pytest.mark.engine_independent
def test_runqueueworker_concurrency_100000_is_a_clear_error() -> None:
    with pytest.raises(CommandError, match="must be at most 1024"):
        call_command("runqueueworker", "workerapp.WorkItems", "--concurrency", "100000")


# --- deep JSON and lone surrogates (issue 23) --------------------------------------------------
_DEEP_TEXT = "[" * 2000 + "]" * 2000


def _deep_list(depth: int = 2000) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "payload",
    [_DEEP_TEXT.encode(), _deep_list(), {"a": _deep_list()}],
    ids=["json-text", "list", "dict"],
)
def test_json_nested_2000_deep_is_a_payload_error_saying_so(payload: Any) -> None:
    """Was ``RecursionError`` for JSON text (``canonical_json``); the message names the depth."""
    from tests.tasksapp.models import Notifications

    with pytest.raises(PayloadError, match="nested too deeply"):
        Notifications.send(id="deep", payload=payload)
    assert not Notifications.objects.exists()


@pytest.mark.engine_independent
def test_decoding_json_nested_2000_deep_is_a_payload_error() -> None:
    from spanner_queues.payload import decode_json

    with pytest.raises(PayloadError, match="nested too deeply"):
        decode_json(_DEEP_TEXT.encode())


@pytest.mark.parametrize(
    ("queue", "spec"),
    [
        ("testapp.UserTasks", {"user_id": 1, "message_id": "a\udc80"}),
        ("testapp.Jobs", {"id": "\ud800"}),
    ],
)
def test_a_key_with_a_lone_surrogate_is_invalid_message_and_writes_nothing(
    queue: str, spec: dict
) -> None:
    """Was ``UnicodeEncodeError`` from the driver."""
    with pytest.raises(InvalidMessage, match="not valid Unicode"):
        api.send(queue, **spec)
    with pytest.raises(InvalidMessage, match="not valid Unicode"):
        api.replace(queue, spec)
    from spanner_queues.queues import get_queue

    assert not get_queue(queue).objects.exists()

"""System checks, settings parsing, payload encoding and transaction retry."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import checks
from django.db import OperationalError, connection
from django.test import override_settings

from spanner_queues import drivers, transactions
from spanner_queues.checks import check_queues
from spanner_queues.conf import NATIVE_ENGINE, TABLE_ENGINE, parse_engine
from spanner_queues.engines import engines
from spanner_queues.exceptions import InvalidQueueEngine, PayloadError
from spanner_queues.payload import decode_json, encode_payload
from tests.testapp.models import Account


def _ids(messages: list[checks.CheckMessage]) -> list[str]:
    return sorted(m.id for m in messages)


def test_valid_configuration_has_no_errors() -> None:
    assert [m for m in check_queues() if m.level >= checks.WARNING] == []


@pytest.mark.parametrize(
    ("setting", "error"),
    [
        ({"default": {"ENGINE": "no.such.Engine"}}, "spanner_queues.E001"),
        ({"default": {"ENGINE": "table", "OPTIONS": {"LEASE_SECONDS": -1}}}, "spanner_queues.E001"),
        ({"default": {"ENGINE": "table", "COLOUR": 1}}, "spanner_queues.E001"),
        ({"default": {"ENGINE": "table", "DATABASE": "nope"}}, "spanner_queues.E006"),
        ({"other": {"ENGINE": "table"}}, "spanner_queues.E002"),
    ],
)
def test_configuration_mistakes_are_check_errors(setting: dict, error: str) -> None:
    with override_settings(SPANNER_QUEUES=setting):
        assert error in _ids(check_queues())


def test_sqlite_without_immediate_is_an_error() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("SQLite-specific check")
    driver = drivers.SQLiteDriver(connection)
    original = connection.settings_dict["OPTIONS"]
    try:
        connection.settings_dict["OPTIONS"] = {}
        assert _ids(driver.check()) == ["spanner_queues.E003", "spanner_queues.W001"]
    finally:
        connection.settings_dict["OPTIONS"] = original
    assert driver.check() == []


def test_parse_engine_defaults_and_shortcuts() -> None:
    params = parse_engine("default", {})
    assert params.engine == TABLE_ENGINE and params.lease == timedelta(seconds=10)
    assert params.max_payload_bytes == 4096
    assert parse_engine("x", {"ENGINE": "native"}).engine == NATIVE_ENGINE
    params = parse_engine("x", {"OPTIONS": {"BACKOFF": {"INITIAL_SECONDS": 2, "MULTIPLIER": 3}}})
    assert params.backoff.delay(3, timedelta(0)) == timedelta(seconds=18)
    with pytest.raises(InvalidQueueEngine, match="MULTIPLIER"):
        parse_engine("x", {"OPTIONS": {"BACKOFF": {"MULTIPLIER": 0.5}}})
    with pytest.raises(InvalidQueueEngine, match="unknown keys: JITTER"):
        parse_engine("x", {"OPTIONS": {"BACKOFF": {"JITTER": 1}}})


def test_engine_handler_resets_on_setting_change() -> None:
    before = engines["default"].params.lease
    with override_settings(SPANNER_QUEUES={"default": {"OPTIONS": {"LEASE_SECONDS": 42}}}):
        assert engines["default"].params.lease == timedelta(seconds=42)
    assert engines["default"].params.lease == before


def test_payload_encoding() -> None:
    assert encode_payload(b"a") == b"a" and encode_payload(bytearray(b"b")) == b"b"
    assert encode_payload("é") == "é".encode()
    assert encode_payload({"a": [1]}) == b'{"a":[1]}'
    with pytest.raises(PayloadError):
        encode_payload(float("nan"))
    with pytest.raises(PayloadError, match="not JSON"):
        decode_json(b"\xff")


def test_driver_error_classification() -> None:
    from google.api_core import exceptions as gexc
    from google.cloud.spanner_dbapi.exceptions import RetryAborted

    spanner = drivers.SpannerDriver(connection)
    wrapped = OperationalError("x")
    wrapped.__cause__ = RetryAborted("replay differed")
    assert spanner.is_retryable(gexc.Aborted("aborted")) and spanner.is_retryable(wrapped)
    assert not spanner.is_retryable(gexc.InvalidArgument("bad"))
    dup = OperationalError("[]")
    dup.__cause__ = gexc.AlreadyExists("row exists")
    assert spanner.is_duplicate_key(dup)
    assert spanner.is_missing_parent(gexc.NotFound("key was not found in parent table"))
    sqlite = drivers.SQLiteDriver(connection)
    assert sqlite.is_retryable(OperationalError("database is locked"))
    assert not sqlite.is_retryable(OperationalError("no such table"))


def test_postgresql_retries_serialization_failures_and_deadlocks_psycopg3_and_psycopg2() -> None:
    """The driver read ``exc.__cause__.sqlstate`` only: psycopg2's ``pgcode`` and errors
    further down the chain were not retried."""
    from psycopg import errors as pg3

    class Psycopg2Error(Exception):  # psycopg2 reports the SQLSTATE as ``pgcode``
        def __init__(self, pgcode: str) -> None:
            super().__init__(pgcode)
            self.pgcode = pgcode

    postgres = drivers.PostgreSQLDriver(connection)

    def wrapped(cause: BaseException, depth: int = 1) -> OperationalError:
        outer: BaseException = cause
        for _ in range(depth):
            error = OperationalError("x")
            error.__cause__ = outer
            outer = error
        return outer  # type: ignore[return-value]

    for cause in (
        pg3.SerializationFailure("could not serialize access"),
        pg3.DeadlockDetected("deadlock detected"),
        Psycopg2Error("40001"),
        Psycopg2Error("40P01"),
    ):
        assert postgres.is_retryable(wrapped(cause)), cause
        assert postgres.is_retryable(wrapped(cause, depth=2)), cause
    assert not postgres.is_retryable(wrapped(pg3.UniqueViolation("dup")))
    assert not postgres.is_retryable(wrapped(Psycopg2Error("23505")))


class Flaky(Exception):
    pass


@pytest.mark.django_db(transaction=True)
def test_run_in_transaction_retries_from_a_clean_slate(monkeypatch: pytest.MonkeyPatch) -> None:
    class FlakyDriver(drivers.Driver):
        def is_retryable(self, exc: BaseException) -> bool:
            return isinstance(exc, Flaky)

    monkeypatch.setattr(transactions, "driver_for", lambda alias: FlakyDriver(connection))
    attempts = []

    def work() -> int:
        Account.objects.create(name=f"try {len(attempts)}")
        attempts.append(1)
        if len(attempts) < 3:
            raise Flaky("aborted")
        return Account.objects.count()

    assert transactions.run_in_transaction(work, using="default", retries=5) == 1
    assert list(Account.objects.values_list("name", flat=True)) == ["try 2"]
    attempts.clear()
    with pytest.raises(Flaky):
        transactions.run_in_transaction(work, using="default", retries=1)
    assert Account.objects.count() == 1


def test_use_tz_false_is_an_error() -> None:
    with override_settings(USE_TZ=False):
        assert "spanner_queues.E009" in _ids(check_queues())


def test_unknown_queue_meta_option_lists_the_known_ones() -> None:
    from spanner_queues.checks import _check_queue_model

    class Meta:
        colour = "red"

    class Fake:
        QueueMeta = Meta
        _meta = Account._meta

    from spanner_queues.options import queue_options

    queue_options.cache_clear()
    try:
        errors = [e for e in _check_queue_model(Fake, {}, {"default": {}}) if e.id.endswith("E005")]
    finally:
        queue_options.cache_clear()
    assert "dead_letter_queue" in errors[0].hint and "max_attempts" in errors[0].hint


def test_misspelt_engine_options_are_errors() -> None:
    setting = {"default": {"ENGINE": "table", "OPTIONS": {"LEASE_SECOND": 5}}}
    with override_settings(SPANNER_QUEUES=setting):
        errors = [m for m in check_queues() if m.id == "spanner_queues.E001"]
    assert "unknown keys for TableQueueEngine: LEASE_SECOND" in errors[0].msg
    assert "LEASE_SECONDS" in errors[0].msg


def test_schema_option_drift_from_migrations_is_a_warning() -> None:
    from spanner_queues.checks import _check_schema_options, _recorded_schema_options
    from tests.testapp.models import Jobs, UploadTasks

    recorded = _recorded_schema_options()
    assert recorded[("testapp", "uploadtasks")] == {"interleave_in_parent": "upload"}
    assert _check_schema_options(UploadTasks, recorded) == []
    drifted = {**recorded, ("testapp", "uploadtasks"): {}}
    [warning] = _check_schema_options(UploadTasks, drifted)
    assert warning.id == "spanner_queues.W003" and "AlterQueue" in warning.hint
    assert _check_schema_options(Jobs, {}) == []  # not migrated yet: nothing to compare

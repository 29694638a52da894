"""System checks, settings parsing, payload encoding and transaction retry."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import checks
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.transaction import TransactionManagementError
from django.test import override_settings

from spanner_queues import drivers, transactions
from spanner_queues.checks import check_queues
from spanner_queues.conf import NATIVE_ENGINE, TABLE_ENGINE, parse_engine
from spanner_queues.engines import engines
from spanner_queues.exceptions import InvalidQueueEngine, PayloadError, QueueConfigurationError
from spanner_queues.payload import decode_json, encode_payload
from tests.testapp.models import Account


def _ids(messages: list[checks.CheckMessage]) -> list[str]:
    return sorted(m.id for m in messages)


def test_valid_configuration_has_no_errors() -> None:
    assert [m for m in check_queues() if m.level >= checks.WARNING] == []


@pytest.mark.engine_independent
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


@pytest.mark.engine_independent
def test_parse_engine_defaults_and_shortcuts() -> None:
    params = parse_engine("default", {})
    assert params.engine == TABLE_ENGINE and params.lease == timedelta(seconds=10)
    assert params.max_payload_bytes == 4096
    assert parse_engine("x", {"ENGINE": "native"}).engine == NATIVE_ENGINE
    params = parse_engine("x", {"OPTIONS": {"BACKOFF": {"INITIAL_SECONDS": 2, "MULTIPLIER": 3}}})
    assert params.backoff.longest(3, timedelta(0)) == timedelta(seconds=18)
    assert params.backoff.jitter == 0.2  # the documented default
    with pytest.raises(InvalidQueueEngine, match="MULTIPLIER"):
        parse_engine("x", {"OPTIONS": {"BACKOFF": {"MULTIPLIER": 0.5}}})
    with pytest.raises(InvalidQueueEngine, match="unknown keys: JITER"):
        parse_engine("x", {"OPTIONS": {"BACKOFF": {"JITER": 0.1}}})
    for bad in (-0.1, 1.5, "0.2", True):
        with pytest.raises(InvalidQueueEngine, match="JITTER must be a number from 0 to 1"):
            parse_engine("x", {"OPTIONS": {"BACKOFF": {"JITTER": bad}}})
    exact = parse_engine("x", {"OPTIONS": {"BACKOFF": {"JITTER": 0}}}).backoff
    assert exact.delay(3, timedelta(0)) == exact.longest(3, timedelta(0)) == timedelta(seconds=4)


def test_engine_handler_resets_on_setting_change() -> None:
    before = engines["default"].params.lease
    with override_settings(SPANNER_QUEUES={"default": {"OPTIONS": {"LEASE_SECONDS": 42}}}):
        assert engines["default"].params.lease == timedelta(seconds=42)
    assert engines["default"].params.lease == before


@pytest.mark.engine_independent
def test_payload_encoding() -> None:
    assert encode_payload(b"a") == b"a" and encode_payload(bytearray(b"b")) == b"b"
    assert encode_payload("é") == "é".encode()
    assert encode_payload({"a": [1]}) == b'{"a":[1]}'
    with pytest.raises(PayloadError):
        encode_payload(float("nan"))
    with pytest.raises(PayloadError, match="not JSON"):
        decode_json(b"\xff")


@pytest.mark.engine_independent
def test_payload_encoding_by_payload_type() -> None:
    assert encode_payload("é", payload_type="string") == "é".encode()
    assert encode_payload(b"ok", payload_type="string") == b"ok"
    assert encode_payload({"b": 1, "a": 2}, payload_type="string") == b'{"b":1,"a":2}'
    with pytest.raises(PayloadError, match="UTF-8"):
        encode_payload(b"\xff", payload_type="string")
    assert encode_payload({"b": 1, "a": "é"}, payload_type="json") == '{"a":"é","b":1}'.encode()
    assert encode_payload("x", payload_type="json") == b'"x"'
    assert encode_payload(None, payload_type="json") == b"null"
    assert encode_payload(b' [1, {"b":0,"a":1}] ', payload_type="json") == b'[1,{"a":1,"b":0}]'
    with pytest.raises(PayloadError, match="not JSON"):
        encode_payload(b"", payload_type="json")
    with pytest.raises(QueueConfigurationError, match="payload_type"):
        encode_payload(b"", payload_type="xml")


@pytest.mark.engine_independent
def test_payload_type_is_validated_by_a_check() -> None:
    from django.db import models
    from django.test.utils import isolate_apps

    from spanner_queues.checks import _check_queue_model
    from spanner_queues.models import Queue

    with isolate_apps("tests.testapp"):

        class Xml(Queue):
            Meta = type("Meta", (), {"app_label": "testapp"})
            id = models.IntegerField(primary_key=True)

            class QueueMeta:
                payload_type = "xml"

        class Mismatch(Queue):
            Meta = type("Meta", (), {"app_label": "testapp"})
            id = models.IntegerField(primary_key=True)
            payload = models.BinaryField(db_column="Payload")

            class QueueMeta:
                payload_type = "string"

        class OwnText(Queue):
            Meta = type("Meta", (), {"app_label": "testapp"})
            id = models.IntegerField(primary_key=True)
            payload = models.TextField(db_column="Payload")

        class Floaty(Queue):
            Meta = type("Meta", (), {"app_label": "testapp"})
            id = models.IntegerField(primary_key=True)
            payload = models.FloatField(db_column="Payload")

        def e012(model: type) -> list[str]:
            return [
                e.msg
                for e in _check_queue_model(model, {}, {"default": {}})
                if e.id == "spanner_queues.E012"
            ]

        [xml] = e012(Xml)
        assert "'xml'" in xml and "'bytes', 'string' or 'json'" in xml
        [mismatch] = e012(Mismatch)
        assert "payload_type = 'string'" in mismatch and "BinaryField" in mismatch
        assert e012(OwnText) == []  # a TextField payload declared by hand is a string queue
        [floaty] = e012(Floaty)
        assert "FloatField" in floaty


@pytest.mark.engine_independent
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


@pytest.mark.engine_independent
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


@pytest.mark.django_db(transaction=True)
def test_run_in_a_callers_block_a_swallowed_database_error_is_raised_not_lost() -> None:
    """In a caller's block, ``fn`` runs in a savepoint (``transactions.savepoint``); one that
    catches a database error of its own and returns has lost its writes: that raises, where
    ``atomic()`` would return as if they were kept. The caller's other writes stay."""
    taken = Account.objects.create(name="taken")

    def swallow() -> str:
        Account.objects.create(name="lost with the savepoint")
        try:
            Account.objects.create(pk=taken.pk, name="a second row under a taken key")
        except IntegrityError:
            pass
        return "done"

    with transaction.atomic():
        Account.objects.create(name="the caller's")
        if not connection.features.uses_savepoints:  # Spanner: no savepoint to roll back to
            pytest.skip("a savepoint's rollback needs savepoints (SQLite, PostgreSQL)")
        with pytest.raises(TransactionManagementError, match="marked for rollback"):
            transactions.run_in_transaction(swallow, using="default")
    names = sorted(Account.objects.values_list("name", flat=True))
    assert names == ["taken", "the caller's"]


@pytest.mark.engine_independent
def test_use_tz_false_is_an_error() -> None:
    with override_settings(USE_TZ=False):
        assert "spanner_queues.E009" in _ids(check_queues())


@pytest.mark.engine_independent
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


@pytest.mark.engine_independent
@pytest.mark.parametrize("engine", [None, 42, ["table"], ""])
def test_an_engine_that_is_not_a_dotted_path_is_refused(engine: object) -> None:
    with pytest.raises(InvalidQueueEngine, match=r"\[.ENGINE.\] must be a dotted path"):
        parse_engine("x", {"ENGINE": engine})
    with override_settings(SPANNER_QUEUES={"default": {"ENGINE": engine}}):
        assert "spanner_queues.E001" in _ids(check_queues())


@pytest.mark.engine_independent
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


def _queue_check_errors(check_id: str, queue_meta: dict[str, object]) -> list:
    """The ``check_id`` errors of a queue (keys ``created``, ``n``) declaring ``queue_meta``."""
    from django.db import models
    from django.test.utils import isolate_apps

    from spanner_queues.checks import _check_queue_model
    from spanner_queues.models import Queue
    from spanner_queues.options import queue_options

    with isolate_apps("tests.testapp"):

        class Checked(Queue):
            Meta = type("Meta", (), {"app_label": "testapp"})
            created = models.DateTimeField()
            n = models.IntegerField()
            pk = models.CompositePrimaryKey("created", "n")
            QueueMeta = type("QueueMeta", (), queue_meta)

        queue_options.cache_clear()
        try:
            return [e for e in _check_queue_model(Checked, {}, {"default": {}}) if e.id == check_id]
        finally:
            queue_options.cache_clear()


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        ({"older_than": "deliver_time", "days": 7}, None),
        ({"older_than": "created", "days": 0}, None),
        ({"older_than": "deliver_time"}, "'days'"),
        ({"older_than": "deliver_time", "days": -1}, "non-negative"),
        ({"older_than": "deliver_time", "days": True}, "non-negative"),
        ({"older_than": "deliver_time", "days": 1, "hours": 2}, "'hours'"),
        ({"older_than": "n", "days": 1}, "timestamp"),
        ({"older_than": "nope", "days": 1}, "timestamp"),
        ("OLDER_THAN(DeliverTime, INTERVAL 7 DAY)", "dict"),
    ],
)
def test_row_deletion_policy_is_validated_by_a_check(policy: object, reason: str | None) -> None:
    errors = _queue_check_errors("spanner_queues.E013", {"row_deletion_policy": policy})
    if reason is None:
        assert errors == []
    else:
        [error] = errors
        assert "row_deletion_policy" in error.msg and reason in error.msg


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    ("source", "target", "ok"),
    [
        ("bytes", "bytes", True),
        ("string", "bytes", True),
        ("json", "string", True),
        ("json", "json", True),
        ("bytes", "string", False),
        ("bytes", "json", False),
        ("string", "json", False),
    ],
)
def test_dead_letter_queue_must_take_the_payloads(
    source: str, target: str, ok: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import models
    from django.test.utils import isolate_apps

    from spanner_queues import queues
    from spanner_queues.checks import _check_queue_model
    from spanner_queues.models import Queue

    with isolate_apps("tests.testapp"):

        class Dead(Queue):
            Meta = type("Meta", (), {"app_label": "testapp"})
            QueueMeta = type("QueueMeta", (), {"payload_type": target})
            id = models.IntegerField(primary_key=True)

        class Live(Queue):
            Meta = type("Meta", (), {"app_label": "testapp"})
            QueueMeta = type(
                "QueueMeta",
                (),
                {"payload_type": source, "max_attempts": 3, "dead_letter_queue": "x.Dead"},
            )
            id = models.IntegerField(primary_key=True)

        original = queues.get_queue
        monkeypatch.setattr(
            queues, "get_queue", lambda queue: Dead if queue == "x.Dead" else original(queue)
        )
        errors = [
            e.msg
            for e in _check_queue_model(Live, {}, {"default": {}})
            if e.id == "spanner_queues.E008"
        ]
    assert errors == [] if ok else ("payload" in errors[0] and len(errors) == 1)


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"concurrency_limit": 2, "rate_limit": 0.5}, None),
        ({"concurrency_limit": 0}, "concurrency_limit must be a positive int"),
        ({"concurrency_limit": 1.5}, "concurrency_limit must be a positive int"),
        ({"concurrency_limit": True}, "concurrency_limit must be a positive int"),
        ({"rate_limit": 0}, "rate_limit must be a positive number"),
        ({"rate_limit": "10"}, "rate_limit must be a positive number"),
        ({"rate_limit": float("nan")}, "rate_limit must be a positive number"),
        # one start in 3 years (the check let it pass; the bucket then held the queue to 2030)
        ({"rate_limit": 1e-8}, "at least one a day"),
        ({"rate_limit": 1 / 86400}, None),
        ({"rate_limit": 1e6}, "rate_limit must be a positive number"),
    ],
)
def test_queue_limits_are_validated_by_a_check(options: dict, reason: str | None) -> None:
    errors = _queue_check_errors("spanner_queues.E020", options)
    if reason is None:
        assert errors == []
    else:
        [error] = errors
        assert reason in error.msg


@pytest.mark.engine_independent
def test_a_misplaced_top_level_key_lists_the_known_keys_and_the_closest() -> None:
    """``LEASE_SECONDS`` beside ``ENGINE`` belongs in ``OPTIONS``; a typo of a key gets the
    closest known one."""
    setting = {"default": {"ENGINE": "table", "LEASE_SECONDS": 5}}
    with override_settings(SPANNER_QUEUES=setting):
        [error] = [m for m in check_queues() if m.id == "spanner_queues.E001"]
    assert error.msg == (
        "SPANNER_QUEUES['default'] has unknown keys: LEASE_SECONDS. Known: DATABASE, ENGINE, "
        "OPTIONS. LEASE_SECONDS is an OPTIONS key: SPANNER_QUEUES['default']['OPTIONS']"
        "['LEASE_SECONDS']."
    )
    with pytest.raises(InvalidQueueEngine) as raised:
        parse_engine("default", {"ENGINES": "table"})
    assert str(raised.value) == (
        "SPANNER_QUEUES['default'] has unknown keys: ENGINES. Known: DATABASE, ENGINE, OPTIONS. "
        "Did you mean ENGINE?"
    )


@pytest.mark.engine_independent
def test_a_misspelt_engine_shortcut_names_the_shortcuts_and_the_closest() -> None:
    with override_settings(SPANNER_QUEUES={"default": {"ENGINE": "tabel"}}):
        [error] = [m for m in check_queues() if m.id == "spanner_queues.E001"]
    assert error.msg.startswith(
        "SPANNER_QUEUES['default']['ENGINE'] = 'tabel' is neither a shortcut ('table', "
        "'native') nor an importable dotted path. Did you mean 'table'?"
    ), error.msg


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    ("ordered_by", "reason"),
    [
        (("created",), None),
        (["created"], None),
        (("created", "n"), "a proper prefix of its key"),
        (("n",), "a proper prefix of its key"),
        (("customer",), "a proper prefix of its key"),
        ("created", "must be a non-empty tuple of key field names"),
        ((), "must be a non-empty tuple of key field names"),
    ],
)
def test_ordered_by_must_name_a_proper_prefix_of_the_key(
    ordered_by: object, reason: str | None
) -> None:
    errors = _queue_check_errors("spanner_queues.E021", {"ordered_by": ordered_by})
    if reason is None:
        assert errors == []
    else:
        [error] = errors
        assert reason in error.msg

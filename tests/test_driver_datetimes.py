"""``Driver.datetime_param`` and ``Driver.datetime_reader``: the hot path's datetime parameters
and converters are exactly what the backend's own give (on SQLite a faster equivalent of
Django's adapter and converter, elsewhere Django's)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test import override_settings

from spanner_queues.drivers import driver_for

AWARE = [
    datetime(2026, 12, 4, 17, 30, 1, 123456, tzinfo=timezone.utc),
    datetime(2026, 12, 4, 17, 30, 1, tzinfo=timezone.utc),  # no microseconds: no ".000000"
    datetime(2026, 12, 4, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-5))),
    datetime(2026, 3, 29, 2, 30, tzinfo=ZoneInfo("Europe/Paris")),
    datetime(1, 1, 1, 0, 0, tzinfo=timezone.utc),
]


@pytest.mark.django_db
def test_the_parameter_of_an_aware_datetime_is_the_backends() -> None:
    adapt = driver_for("default").datetime_param()
    ops = connection.ops
    for value in [*AWARE, None]:
        assert adapt(value) == ops.adapt_datetimefield_value(value), value


@pytest.mark.django_db
def test_a_stored_datetime_reads_as_the_backends_converter_reads_it() -> None:
    read = driver_for("default").datetime_reader()
    ops = connection.ops
    if read is None:  # (the backend's own converter is used: not SQLite's)
        assert connection.vendor != "sqlite"
        return
    stored = [ops.adapt_datetimefield_value(v) for v in AWARE]
    texts = [
        *stored,
        "2026-12-04 17:30:01",
        "2026-12-04T17:30:01.5+02:00",  # an offset kept, as Django keeps it
        "2026-12-04 17:30",
        None,
        datetime(2026, 12, 4, 17, 30, 1),  # a driver that already gives datetimes
    ]
    for text in texts:
        ours = read(text, None, connection)
        theirs = ops.convert_datetimefield_value(text, None, connection)
        assert ours == theirs and getattr(ours, "tzinfo", None) == getattr(theirs, "tzinfo", None)


@pytest.mark.django_db
def test_without_use_tz_the_backends_own_are_used() -> None:
    with override_settings(USE_TZ=False):
        driver = driver_for("default")
        assert driver.datetime_reader() is None
        assert driver.datetime_param() == connection.ops.adapt_datetimefield_value

"""``receive(lease=...)`` on an engine that cannot honour it (native queues: Spanner leases for
10 s) warns once per queue, clearly, instead of ignoring it silently; where leases can be chosen
it is honoured and nothing is said."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from datetime import timedelta

import pytest

from spanner_queues import api
from tests.testapp.models import UserTasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def not_yet_warned() -> Iterator[None]:
    api._lease_warned.clear()
    yield
    api._lease_warned.clear()


@pytest.mark.unless("supports_custom_lease")
def test_an_ignored_lease_warns_once_per_queue() -> None:
    with pytest.warns(RuntimeWarning) as caught:
        api.receive(UserTasks, lease=timedelta(seconds=30), wait=0)
    [warning] = caught.list
    assert str(warning.message).startswith("testapp.UserTasks: lease= is ignored by the engine")
    assert warning.filename == __file__  # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise here
        api.receive(UserTasks, lease=timedelta(seconds=30), wait=0)


@pytest.mark.requires("supports_custom_lease")
def test_a_lease_the_engine_honours_says_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        api.receive(UserTasks, lease=timedelta(seconds=30), wait=0)

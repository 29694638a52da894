"""A commit the driver could not replay (ABORTED, and the replay read other rows): Django rolls
back after the driver has ended the transaction. The caller gets the error to retry on
(``OperationalError``, retried by ``run_in_transaction``) and no bare ``UserWarning`` of the
driver's ("This method is non-operational..."), which the native demo printed (issue 38,
finding 14)."""

from __future__ import annotations

import warnings

import pytest
from django.db import OperationalError, connection, transaction

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_commit_aborted_past_its_replay_fails_without_a_driver_warning(front) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(OperationalError, match="aborted"):
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 'replay-marker' AS v")
                    assert cursor.fetchall() == [("replay-marker",)]
                # the commit is aborted; the driver's replay reads another answer: no replay
                front.fail("Commit", "ABORTED", "Transaction was aborted")
                front.script("replay-marker", [["something else"]])
    assert [str(w.message) for w in caught if w.category is UserWarning] == []
    with connection.cursor() as cursor:  # the connection is usable after it
        cursor.execute("SELECT 1")
        assert cursor.fetchall() == [(1,)]

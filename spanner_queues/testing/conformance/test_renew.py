"""Conformance: renewing a lease keeps the message and rotates its token; the old token, or a
lease that ran out, is lost (``LeaseLost``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from spanner_queues import api
from spanner_queues.exceptions import LeaseLost
from spanner_queues.testing.conformance.models import UserTasks
from spanner_queues.testing.conformance.support import receive_due, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
SHORT = timedelta(seconds=0.6)


def test_renewal_keeps_message_and_rotates_token() -> None:
    UserTasks.send(user_id=1, message_id="long", payload="x")
    message = receive_due(UserTasks, lease=SHORT)[0]
    for _ in range(3):
        renewed = api.renew(message)
        assert renewed.lease_token != message.lease_token
        assert renewed.lease_expires_at >= message.lease_expires_at
        message = renewed
        assert api.receive(UserTasks) == []  # still ours
    # The superseded token is dead.
    with pytest.raises(LeaseLost):
        api.renew(
            api.receive.__globals__["Message"](
                **{  # rebuild with an old token
                    **{f: getattr(message, f) for f in message.__dataclass_fields__},
                    "lease_token": "stale",
                }
            )
        )


def test_renewing_an_expired_lease_is_lost() -> None:
    UserTasks.send(user_id=1, message_id="x", payload="x")
    message = receive_due(UserTasks, lease=timedelta(seconds=0.2))[0]
    wait_until(lambda: timezone.now() > message.lease_expires_at)
    with pytest.raises(LeaseLost, match="lease lost"):
        api.renew(message)
    assert api.renew_many([message]) == []

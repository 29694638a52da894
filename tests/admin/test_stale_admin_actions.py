"""An admin action never overwrites a message changed since the page was shown."""

from __future__ import annotations

from typing import Any

import pytest

from spanner_queues import api
from spanner_queues.admin.actions import ACTIONS, perform
from spanner_queues.admin.browse import get_messages
from spanner_queues.exceptions import MessageAlreadyAcked
from tests.testapp.models import Jobs

pytestmark = pytest.mark.django_db(transaction=True)


def test_admin_deliver_now_does_not_resurrect_a_stale_payload(django_user_model: Any) -> None:
    """admin/actions.py promises that a message acked by a receiver since the page was
    shown is not resurrected. The view reads the messages (get_messages) outside the action's
    transaction, and the action acks *by key* and re-sends the payload it read. If meanwhile a
    receiver acked the message and sent a new one under the same key (checkpoint(),
    resend_later(), Retry, @periodic, replace()), the ack succeeds on the *new* message and the
    old payload replaces it: the checkpointed state is lost."""
    user = django_user_model.objects.create_user("op", password="pw", is_staff=True)
    m = Jobs.send(payload={"step": 1})
    shown = get_messages(Jobs, [m.key])  # the confirmation POST reads the selection
    # meanwhile a receiver checkpoints: ack + send under the same key with new state
    api.replace(Jobs, m.key_dict, payload={"step": 2})
    with pytest.raises(MessageAlreadyAcked, match="changed since the page was shown"):
        perform(ACTIONS["deliver_now"], Jobs, shown, user_id=user.pk)
    assert Jobs.objects.get(pk=m.key[0]).as_message().json() == {"step": 2}

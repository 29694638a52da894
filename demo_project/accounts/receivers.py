"""Receivers of ``UserTasks``: one per ``message_id`` (a key column), chosen with ``match=``.

Emails are external side effects: the receivers are not atomic, so the email is sent first and
the worker acks afterwards. A crash between the two sends the email again on redelivery
(at-least-once); it is never lost.
"""

from __future__ import annotations

from django.contrib.auth.models import User
from django.core.mail import send_mail
from django.utils import timezone

from demo_project.accounts.models import UserTasks
from spanner_queues import receiver
from spanner_queues.message import Message


@receiver(UserTasks, match={"message_id": "welcome"}, atomic=False)
def send_welcome_email(message: Message) -> None:
    """Pattern 1: work after commit. The message exists only if the sign-up committed."""
    user = User.objects.filter(pk=message.key_dict["user_id"]).first()
    if user is None:  # deleted since: nothing to do, the message is acked
        return
    send_mail(
        "Welcome to the demo shop",
        f"Hello {user.username}, thanks for signing up!",
        None,
        [user.email],
    )


@receiver(UserTasks, match={"message_id": "trial-reminder"}, atomic=False)
def send_trial_reminder(message: Message) -> None:
    """Pattern 4: scheduled work, delivered at its deliver time (a day before the trial ends)."""
    user = User.objects.filter(pk=message.key_dict["user_id"]).select_related("profile").first()
    if user is None or user.profile.plan != "trial":  # gone, or upgraded meanwhile
        return
    left = user.profile.trial_ends_at - timezone.now()
    send_mail(
        "Your trial ends soon",
        f"Hello {user.username}, your trial ends in {max(left.total_seconds(), 0) / 3600:.0f} h.",
        None,
        [user.email],
    )

"""Sign-up and profile edits: every write and its messages in one transaction."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from demo_project.accounts.models import Profile, UserTasks
from demo_project.search.services import mark_dirty

#: length of the free trial, and how long before its end the reminder is due
TRIAL = timedelta(days=30)
REMINDER_BEFORE = timedelta(days=1)


def sign_up(username: str, email: str, *, trial: timedelta = TRIAL) -> User:
    """Create the user, the profile and two messages, or nothing at all.

    - the welcome email: written by the outbox registration on User (see ``apps.py``);
    - the trial reminder (pattern 4, scheduled work): due ``REMINDER_BEFORE`` the trial ends,
      29 days ahead with the default trial. It is not delivered a moment earlier.
    """
    with transaction.atomic():
        user = User.objects.create_user(username, email)  # + UserTasks(user, "welcome")
        profile = Profile.objects.create(user=user, trial_ends_at=timezone.now() + trial)
        UserTasks.send(
            user_id=user.pk,
            message_id="trial-reminder",
            deliver_time=profile.trial_ends_at - REMINDER_BEFORE,
        )
        mark_dirty(user.pk)  # index the new user
    return user


def update_profile(user_id: int, **changes: Any) -> Profile:
    """Save profile fields and mark the user's search entry dirty, in one transaction
    (pattern 9, dirty flag)."""
    with transaction.atomic():
        profile = Profile.objects.select_for_update().get(user_id=user_id)
        for name, value in changes.items():
            setattr(profile, name, value)
        profile.save(update_fields=list(changes))
        mark_dirty(user_id)
    return profile

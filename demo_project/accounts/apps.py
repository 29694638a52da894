"""Sign-up, profiles and the user task queue (welcome email, trial reminder)."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig


def welcome_key(user: Any, **context: Any) -> dict[str, Any]:
    """One welcome message per user: ``UserTasks(user_id, "welcome")``."""
    return {"user_id": user.pk, "message_id": "welcome"}


class AccountsConfig(AppConfig):
    name = "demo_project.accounts"
    label = "accounts"

    def ready(self) -> None:
        from django.contrib.auth import get_user_model

        from spanner_queues import outbox

        # Pattern 1 (outbox): creating a User writes UserTasks(user_id, "welcome") in the same
        # transaction. A user created outside transaction.atomic() is refused
        # (TransactionRequired), so the message can never be lost or sent for a rolled-back user.
        outbox.register(
            get_user_model(),
            queue="accounts.UserTasks",
            on="created",
            key=welcome_key,
            payload=lambda user, **context: {"email": user.email},
        )

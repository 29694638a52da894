"""The admin of the Pub/Sub app: the relay's archive (``RelayedEvent``), read-only, filterable
by queue and publish time, with an action replaying the chosen events (``pubsubreplay``'s)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from spanner_queues.contrib.pubsub.models import RelayedEvent


@admin.register(RelayedEvent)
class RelayedEventAdmin(admin.ModelAdmin):
    """The archive, read-only: rows are written by the relay and pruned after the window."""

    list_display = ("published_at", "queue", "event_id", "key", "ordering_key")
    list_filter = ("queue", "published_at")
    search_fields = ("event_id", "key")
    date_hierarchy = "published_at"
    ordering = ("-published_at",)
    actions = ["replay_events"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_superuser)

    @admin.action(description="Replay the selected events to their topics", permissions=["replay"])
    def replay_events(self, request: HttpRequest, queryset: QuerySet[RelayedEvent]) -> None:
        # imported here: Google's Pub/Sub client loads only when an operator replays, so the
        # admin of a project without the `pubsub` extra (or a check) never imports it
        from spanner_queues.contrib.pubsub.replay import ReplayFailed, new_replay_id, replay

        replay_id = new_replay_id()
        try:
            done = replay(queryset, replay_id)
        except ReplayFailed as exc:
            self.message_user(request, f"Replay {replay_id} stopped: {exc}", messages.ERROR)
            return
        self.message_user(
            request,
            f"Replay {replay_id}: {done} event(s) published. Inboxes drop the events they took "
            "in before as duplicates; to have one take them in again, accept a replay id first "
            "(manage.py pubsubacceptreplay) and replay with manage.py pubsubreplay --replay-id.",
        )

"""Marking users dirty, and recomputing their search entries."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import User
from django.utils import timezone

from demo_project.search.models import ReindexQueue, SearchEntry


def mark_dirty(user_id: int) -> None:
    """Flag ``user_id`` for reindexing, in the caller's transaction.

    A tiny message (key only, no payload). If the flag is already up, nothing is sent: keys are
    identity, so a second send would raise ``MessageAlreadyExists``. Both the check and the send
    run in the caller's (serializable) transaction, so an edit racing with the reindexer either
    sees the flag still up (and the reindexer then reads the edit) or sends a new one.
    """
    if not ReindexQueue.objects.filter(user_id=user_id).exists():
        ReindexQueue.send(user_id=user_id)


def reindex(user_ids: Iterable[int]) -> int:
    """Recompute the search entries of ``user_ids``; returns how many exist now."""
    ids = set(user_ids)
    users = User.objects.filter(pk__in=ids).select_related("profile")
    now = timezone.now()
    entries = []
    for user in users:
        profile = getattr(user, "profile", None)
        words = [user.username, user.email]
        if profile is not None:
            words += [profile.display_name, profile.bio]
        text = " ".join(w for w in words if w)
        entries.append(SearchEntry(user_id=user.pk, text=text, indexed_at=now))
    SearchEntry.objects.filter(user_id__in=ids).delete()
    SearchEntry.objects.bulk_create(entries)
    return len(entries)

"""Registering a model the project does not own: ``django.contrib.auth``'s User."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import update_last_login
from django.core.management import call_command
from django.db import transaction

from spanner_queues.exceptions import TransactionRequired
from tests.outbox.conftest import payloads
from tests.outboxapp.models import UserEvents

pytestmark = pytest.mark.django_db(transaction=True)


def test_user_events(user_outbox: Any) -> None:
    with transaction.atomic():
        user = user_outbox.objects.create_user("ada", "ada@example.com", "pw")
    update_last_login(None, user)  # autocommit, update_fields=["last_login"]: not tracked
    with transaction.atomic():
        user.set_password("new")
        user.save()  # password is not a tracked field
    with transaction.atomic():
        user.email = "ada@example.org"
        user.save()
    pk = user.pk
    user.delete()
    events = {e["event"]: e for e in payloads(UserEvents, user_id=pk)}
    assert sorted(events) == ["created", "deleted", "updated"]
    assert UserEvents.objects.count() == 3
    assert events["created"]["model"] == "auth.user"
    assert events["updated"]["changed"] == ["email"]
    assert events["deleted"]["data"] == {"email": "ada@example.org", "is_active": True}


def test_createsuperuser_needs_an_atomic_block(user_outbox: Any) -> None:
    """``createsuperuser`` saves in autocommit: refused, with nothing written. Run it inside
    ``transaction.atomic()`` (e.g. from ``manage.py shell``) to get its 'created' message."""
    options = {
        "interactive": False,
        "username": "root",
        "email": "root@example.com",
        "verbosity": 0,
    }
    with pytest.raises(TransactionRequired, match=r"auth.User.save\(\) outside"):
        call_command("createsuperuser", **options)
    assert not user_outbox.objects.exists() and not UserEvents.objects.exists()
    with transaction.atomic():
        call_command("createsuperuser", **options)
    assert [e["event"] for e in payloads(UserEvents)] == ["created"]


def test_admin_saves_are_atomic(user_outbox: Any, client: Any) -> None:
    with transaction.atomic():
        admin = user_outbox.objects.create_superuser("admin", "admin@x", "pw")
    client.force_login(admin)
    response = client.post(
        "/admin/auth/user/add/",
        {
            "username": "bob",
            "password1": "a-Long-pw-123",
            "password2": "a-Long-pw-123",
            "usable_password": "true",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    bob = user_outbox.objects.get(username="bob")
    assert sorted((e["pk"], e["event"]) for e in payloads(UserEvents)) == sorted(
        [(admin.pk, "created"), (bob.pk, "created")]
    )


def test_loaddata_sends_nothing(user_outbox: Any, tmp_path: Any) -> None:
    """Fixtures are saved with raw=True: no messages (and no refusal)."""
    fixture = tmp_path / "users.json"
    fixture.write_text(
        '[{"model": "auth.user", "pk": 4242, "fields": {"username": "fx", "password": "!",'
        ' "email": "fx@x", "is_active": true}}]'
    )
    call_command("loaddata", str(fixture), verbosity=0)
    assert user_outbox.objects.get().username == "fx"
    assert not UserEvents.objects.exists()

"""Fixtures for the admin pages: users with and without the app's permissions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

OVERVIEW = "/admin/spanner_queues/queues/"
ALL_ACTIONS = ("ack_message", "reschedule_message", "dead_letter_message")


def queue_url(label: str) -> str:
    return f"{OVERVIEW}{label.lower()}/"


def action_url(label: str) -> str:
    return f"{queue_url(label)}actions/"


@pytest.fixture
def make_user(django_user_model: Any) -> Callable[..., Any]:
    """A user with the given spanner_queues permission codenames (staff unless told)."""

    def make(*codenames: str, staff: bool = True, name: str = "operator") -> Any:
        user = django_user_model.objects.create_user(name, password="pw", is_staff=staff)
        perms = Permission.objects.filter(
            content_type__app_label="spanner_queues", codename__in=codenames
        )
        assert perms.count() == len(codenames), "unknown permission codename"
        user.user_permissions.set(perms)
        return user

    return make


@pytest.fixture
def login(client: Client) -> Callable[[Any], Client]:
    def as_user(user: Any) -> Client:
        client.force_login(user)
        return client

    return as_user


@pytest.fixture
def operator_client(make_user: Callable[..., Any], login: Callable[[Any], Client]) -> Client:
    """Staff with the view permission and every action permission."""
    return login(make_user("view_queues", *ALL_ACTIONS))


@pytest.fixture
def viewer_client(make_user: Callable[..., Any], login: Callable[[Any], Client]) -> Client:
    """Staff with the view permission only."""
    return login(make_user("view_queues", name="viewer"))

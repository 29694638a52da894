from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from spanner_queues import outbox
from tests.outboxapp.models import UserEvents


def payloads(queue: Any, **filters: Any) -> list[dict[str, Any]]:
    """The JSON payloads of a queue's messages, in no particular order."""
    return [
        json.loads(bytes(p))
        for p in queue.objects.filter(**filters).values_list("payload", flat=True)
    ]


@pytest.fixture
def registered() -> Iterator[Any]:
    """Register models for one test; every registration made through it is undone after."""
    made: list[tuple[Any, Any]] = []

    def register(model: Any, **options: Any) -> Any:
        outbox.register(model, **options)
        made.append((model, options["queue"]))
        return model

    yield register
    for model, queue in reversed(made):
        outbox.unregister(model, queue)


@pytest.fixture
def user_outbox(registered: Any) -> Any:
    """``auth.User`` registered as a project would in ``AppConfig.ready()``."""
    user = get_user_model()
    registered(user, queue=UserEvents, fields=("email", "is_active"))
    return user

"""The overview's operator controls: pause and resume a queue for every worker (a badge and a
button, ``spanner_queues.pause_queue``), and the ``@periodic`` schedules with their next run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.test import Client

from spanner_queues import api, patterns
from spanner_queues.engines import engine_for
from spanner_queues.models import Queues
from tests.admin.conftest import OVERVIEW, queue_url
from tests.workerapp.models import Ticks, WorkItems

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_pauses_and_resumes_a_queue_from_the_overview(
    make_user: Callable[..., Any], login: Callable[[Any], Client]
) -> None:
    client = login(make_user("view_queues", "pause_queue"))
    page = client.get(OVERVIEW).content.decode()
    assert 'name="op" value="pause"' in page and 'class="sq-badge sq-paused"' not in page
    done = client.post(f"{queue_url('workerapp.WorkItems')}pause/", {"op": "pause"}, follow=True)
    assert "Paused workerapp.WorkItems for every worker." in done.content.decode()
    assert api.is_paused(WorkItems)
    page = client.get(OVERVIEW).content.decode()
    assert 'class="sq-badge sq-paused"' in page and "paused by operator" in page
    assert 'name="op" value="resume"' in page
    done = client.post(f"{queue_url('workerapp.WorkItems')}pause/", {"op": "resume"}, follow=True)
    assert "Resumed workerapp.WorkItems: workers receive" in done.content.decode()
    assert not api.is_paused(WorkItems)


def test_pause_and_resume_are_in_the_admin_history(
    make_user: Callable[..., Any], login: Callable[[Any], Client]
) -> None:
    user = make_user("view_queues", "pause_queue")
    client = login(user)
    url = f"{queue_url('workerapp.WorkItems')}pause/"
    client.post(url, {"op": "pause", "reason": "carrier down"})
    client.post(url, {"op": "pause"})  # already paused: nothing changed, nothing logged
    client.post(url, {"op": "resume"})
    entries = LogEntry.objects.using(engine_for(WorkItems).database).order_by("action_time")
    assert [(e.user_id, e.action_flag, e.object_id, e.change_message) for e in entries] == [
        (user.pk, CHANGE, "workerapp.WorkItems", "Paused for every worker: carrier down."),
        (user.pk, CHANGE, "workerapp.WorkItems", "Resumed: workers receive from it again."),
    ]
    assert {e.content_type.model_class() for e in entries} == {Queues}


def test_pausing_needs_its_own_permission(viewer_client: Client) -> None:
    assert 'value="pause"' not in viewer_client.get(OVERVIEW).content.decode()
    response = viewer_client.post(f"{queue_url('workerapp.WorkItems')}pause/", {"op": "pause"})
    assert response.status_code == 403
    assert not api.is_paused(WorkItems)
    api.pause(WorkItems, reason="deploy")
    page = viewer_client.get(OVERVIEW).content.decode()
    assert 'class="sq-badge sq-paused"' in page and "deploy" in page  # seen, not changed


def test_the_overview_lists_each_schedule_with_its_next_run(viewer_client: Client) -> None:
    page = viewer_client.get(OVERVIEW).content.decode()
    assert "Schedules" in page and "name=&#x27;tick&#x27;" in page
    assert "not queued: a worker of its queue seeds it when it starts" in page
    [seeded] = patterns.seed_schedules(["workerapp.Ticks"])
    assert seeded.deliver_time is not None
    # the stored deliver time, not the one ``send`` returned: on native queues a message due at
    # once is due at its commit timestamp, which a busy machine puts in a later second than the
    # client's clock read before the commit (a red run beside a soak)
    stored = Ticks.objects.get(name="tick").deliver_time
    page = viewer_client.get(OVERVIEW).content.decode()
    shown = stored.astimezone(ZoneInfo("UTC")).strftime("%Y-%m-%d %H:%M:%S")
    assert shown in page

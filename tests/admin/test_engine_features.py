"""The pages gate on ``engine.features``, never on the vendor: fewer features, fewer columns."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.test import Client

from spanner_queues.engines import engine_for
from tests.admin.conftest import OVERVIEW, queue_url
from tests.testapp.models import Jobs

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_empty_queue_lists_no_messages(operator_client: Client) -> None:
    html = operator_client.get(queue_url("testapp.Jobs")).content.decode()
    assert "No messages." in html and "cannot list messages" not in html


def test_engine_without_listing_shows_counts_only(
    operator_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    Jobs.send(payload="x")
    engine = engine_for(Jobs)
    monkeypatch.setattr(engine, "features", replace(engine.features, supports_listing=False))
    response = operator_client.get(queue_url("testapp.Jobs"))
    html = response.content.decode()
    assert response.context["stats"].total == 1
    assert "cannot list messages" in html and 'id="result_list"' not in html


def test_engine_without_bookkeeping_hides_attempts_and_leases(
    operator_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    Jobs.send(id="a", payload="x")  # sent while the engine still writes bookkeeping
    engine = engine_for(Jobs)
    features = replace(
        engine.features, stores_bookkeeping_fields=False, supports_attempt_count=False
    )
    monkeypatch.setattr(engine, "features", features)
    response = operator_client.get(queue_url("testapp.Jobs"))
    html = response.content.decode()
    assert [r.message.key for r in response.context["page"]] == [("a",)]
    assert "Lease expires" not in html and "Attempts" not in html
    assert [c["display"] for c in response.context["state_choices"]] == [
        "All",
        "Due",
        "Scheduled",
    ]
    assert (
        operator_client.get(queue_url("testapp.Jobs"), {"state": "ready"})
        .context["page"]
        .paginator.count
        == 1
    )
    detail = operator_client.get(f"{queue_url('testapp.Jobs')}messages/a/").content.decode()
    assert "Lease expires" not in detail
    overview = operator_client.get(OVERVIEW)
    row = next(r for r in overview.context["rows"] if r.label == "testapp.Jobs")
    assert not row.attempts and "n/a" in overview.content.decode()

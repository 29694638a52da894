"""The conformance plugin: ``--sq-conformance=ALIAS`` makes that alias the run's default engine
(and refuses an alias that is not configured); every test gets one tier from what it needs."""

from __future__ import annotations

from typing import Any

import pytest

from spanner_queues.engines import engines
from spanner_queues.engines.table import TableQueueEngine
from spanner_queues.exceptions import InvalidQueueEngine, QueueError
from spanner_queues.testing.conformance import plugin

TABLE = "spanner_queues.engines.table.TableQueueEngine"


class OtherTableEngine(TableQueueEngine):
    """Another engine class, to tell which alias ``default`` became."""


@pytest.mark.engine_independent
def test_make_default_puts_the_alias_under_default_and_drops_engines_made_before(
    settings: Any,
) -> None:
    settings.SPANNER_QUEUES = {
        "default": {"ENGINE": TABLE},
        "mine": {"ENGINE": f"{__name__}.OtherTableEngine"},
    }
    assert type(engines["default"]) is not OtherTableEngine
    plugin.make_default("mine")
    assert type(engines["default"]) is OtherTableEngine
    assert type(engines["mine"]) is OtherTableEngine


@pytest.mark.engine_independent
def test_make_default_refuses_an_alias_that_is_not_configured(settings: Any) -> None:
    settings.SPANNER_QUEUES = {"default": {"ENGINE": TABLE}}
    with pytest.raises(InvalidQueueEngine, match="--sq-conformance=nope") as raised:
        plugin.make_default("nope")
    assert isinstance(raised.value, QueueError)


def test_a_test_without_a_database_is_unit(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit")
    assert plugin.tier_of(request.node) == "unit"


@pytest.mark.django_db
def test_a_test_with_a_database_is_integration(request: pytest.FixtureRequest) -> None:
    assert plugin.tier_of(request.node) == "integration"


@pytest.mark.process
def test_a_test_marked_process_is_end_to_end(request: pytest.FixtureRequest) -> None:
    assert plugin.tier_of(request.node) == "e2e"


@pytest.mark.conformance
@pytest.mark.django_db
def test_a_tier_marker_of_its_own_wins(request: pytest.FixtureRequest) -> None:
    assert plugin.tier_of(request.node) == "conformance"

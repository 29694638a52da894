"""JSON payloads with a float that ``PARSE_JSON``'s default (``exact``) mode refuses: the DML
insert parses them with ``wide_number_mode=>'round'``; a ``Send`` mutation's JSON text is
parsed by Spanner itself (the emulator accepts it; ``spannerprobe`` asks a real instance)."""

from __future__ import annotations

import pytest

from spanner_queues import api
from spanner_queues.engines import engines
from tests.conftest import wait_until
from tests.testapp.models import JsonEvents

pytestmark = pytest.mark.django_db(transaction=True)

#: a float the exact mode of PARSE_JSON refuses (seen once in ~1,500 float sends)
WIDE = {"sent_at": 1796283044.567047}


def test_a_json_payload_with_a_wide_float_is_sent_and_received(front) -> None:
    JsonEvents.send(id="wide", payload=WIDE)
    [message] = wait_until(lambda: api.receive(JsonEvents))
    assert message.json()["sent_at"] == pytest.approx(WIDE["sent_at"])


def test_a_send_mutation_with_a_wide_float_is_sent_and_received(front) -> None:
    message = api.build_message(JsonEvents, {"id": "wide-m", "payload": WIDE})
    engines["default"].send_mutations(JsonEvents, [message])
    [got] = wait_until(lambda: api.receive(JsonEvents))
    assert got.json()["sent_at"] == pytest.approx(WIDE["sent_at"])

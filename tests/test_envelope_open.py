"""``open_event`` cuts the JSON data out of a canonical stored event instead of parsing it:
the same payload and attributes as parsing the whole event, for every shape of data and
attribute, a data or an attribute that spells the cut's marker included."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from spanner_queues.envelope import _open_parsed, open_event, wrap
from spanner_queues.payload import BYTES, JSON, STRING

MARKER = ',"datacontenttype":"application/json",'
NOW = datetime(2026, 12, 4, 23, 0, tzinfo=timezone.utc)

PAYLOADS: list[Any] = [
    {"order": 7, "items": ["a"]},
    {"z": 1, "a": {"y": [1.5, -0.0, 1e300, 12345678901234567890]}},
    {"text": 'héllo \u2028 \\ " \n', "marker": MARKER, MARKER: {"datacontenttype": "x"}},
    [MARKER, {"data": 1, "datacontenttype": "application/json", "specversion": "1.0"}],
    "a string",
    3,
    None,
    True,
]


@pytest.mark.parametrize("payload_type", [JSON, BYTES, STRING])
@pytest.mark.parametrize("payload", PAYLOADS)
def test_opening_an_event_cuts_out_what_parsing_it_returns(payload: Any, payload_type: str) -> None:
    for event in (None, {"subject": MARKER + '"}', "type": 'a"b\\'}):
        stored = wrap(
            payload,
            label="app.Events",
            payload_type=payload_type,
            event=event,
            carrier={"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"},
            now=NOW,
            max_bytes=None,
            encoder=None,
        )
        assert open_event(stored) == _open_parsed(stored)


def test_bytes_that_only_look_like_an_event_are_opened_as_before() -> None:
    for stored in (
        b'{"data":1' + MARKER.encode() + b'"id":"x"}',  # no specversion
        b'{"data":1' + MARKER.encode() + b'"id":',  # cut short
        b'{"data":1,"datacontenttype":"text/plain","specversion":"1.0"}',
        b'{"data":1' + MARKER.encode() + b'"data_base64":"AA==","specversion":"1.0"}',
        b"not json",
    ):
        assert open_event(stored) == _open_parsed(stored)

"""Reading messages for the admin: URL-safe keys, state filters, key search, payload display.

Messages are rows of the queue model on every engine, so listing reads them with the ORM (gated
on ``engine.features.supports_listing``). The bookkeeping columns (attempts, lease expiry) are
shown and filtered on only for engines that keep them (``stores_bookkeeping_fields``).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from spanner_queues.engines import engine_for
from spanner_queues.keys import key_fields, key_filter, key_names, row_to_message
from spanner_queues.storage import QueueQuerySet, rows

if TYPE_CHECKING:
    from spanner_queues.engines.base import BaseQueueEngine
    from spanner_queues.message import Message
    from spanner_queues.models import Queue

READY, SCHEDULED, LEASED = "ready", "scheduled", "leased"
STATES = (READY, SCHEDULED, LEASED)
#: what the pages call the states (``STATES`` stay the URL and CSS names): "ready" read as
#: "nothing to do" where workers lease due messages at once
STATE_LABELS = {READY: "due", SCHEDULED: "scheduled", LEASED: "in flight"}
PREVIEW_CHARS = 80
_NOTHING = Q(deliver_time__in=[])


def has_bookkeeping(engine: BaseQueueEngine) -> bool:
    """Whether rows carry attempts, send time and lease expiry (the table engine's columns)."""
    return engine.features.stores_bookkeeping_fields


# --- keys in URLs ---------------------------------------------------------------------------


#: tokens of the values admin ``quote`` leaves unusable in a path (it writes ``_`` itself as
#: ``_5F``, so none of these can come from another value)
_SPECIAL = {"": "_", ".": "_2E", "..": "_2E_2E"}
_SPECIAL_VALUES = {token: value for value, token in _SPECIAL.items()}


def _quote_value(value: Any) -> str:
    text = quote(str(value))
    # an empty segment cannot be a path part; dot segments would walk up the path
    return _SPECIAL.get(text, text)


def key_token(key: Sequence[Any]) -> str:
    """A message key as one non-empty URL path segment: admin ``quote`` escapes ``,`` and
    ``/``; an empty value is ``_`` and the values ``.`` and ``..`` are escaped, so that every
    key has a link of its own."""
    return ",".join(_quote_value(value) for value in key)


def parse_key_token(model: type[Queue], token: str) -> tuple[Any, ...]:
    """The key a ``key_token`` encodes; ``ValueError`` if it does not fit the queue's key."""
    parts = token.split(",")
    fields = key_fields(model)
    if len(parts) != len(fields):
        raise ValueError(f"expected {len(fields)} key value(s), got {len(parts)}")
    try:
        return tuple(
            f.to_python(_SPECIAL_VALUES[p] if p in _SPECIAL_VALUES else unquote(p))
            for f, p in zip(fields, parts, strict=True)
        )
    except ValidationError as exc:
        raise ValueError("; ".join(exc.messages)) from exc


# --- listing --------------------------------------------------------------------------------


def messages_queryset(model: type[Queue]) -> QueueQuerySet:
    return rows(model, engine_for(model).database)


def state_filter(state: str, now: datetime, *, bookkeeping: bool) -> Q:
    """Rows in ``state`` at ``now`` (the same partition as the engine's ``stats()``)."""
    leased = Q(lease_expires_at__gt=now) if bookkeeping else _NOTHING
    if state == LEASED:
        return leased
    due = Q(deliver_time__lte=now) if state == READY else Q(deliver_time__gt=now)
    return due & ~leased if bookkeeping else due


def state_of(message: Message, now: datetime) -> str:
    if message.lease_expires_at is not None and message.lease_expires_at > now:
        return LEASED
    if message.deliver_time is not None and message.deliver_time > now:
        return SCHEDULED
    return READY


def search_filter(model: type[Queue], term: str) -> Q:
    """Rows whose key contains ``term`` (text key fields) or equals it (other key fields)."""
    condition = _NOTHING
    for field in key_fields(model):
        target = field.target_field if field.is_relation else field
        if isinstance(target, (models.CharField, models.TextField)):
            condition |= Q(**{f"{field.attname}__icontains": term})
            continue
        try:
            condition |= Q(**{field.attname: field.to_python(term)})
        except (ValidationError, ValueError, TypeError):
            continue
    return condition


def ordering(model: type[Queue], descending: bool) -> list[str]:
    sign = "-" if descending else ""
    return [f"{sign}deliver_time", *(f"{sign}{name}" for name in key_names(model))]


def get_messages(model: type[Queue], keys: Sequence[tuple[Any, ...]]) -> list[Message]:
    """The messages under ``keys`` that still exist, in the order of ``keys``."""
    if not keys:
        return []
    condition = Q(*[key_filter(model, k) for k in keys], _connector=Q.OR)
    found = {}
    for row in messages_queryset(model).filter(condition):
        message = row_to_message(model, row)
        found[message.key] = message
    return [found[tuple(k)] for k in keys if tuple(k) in found]


# --- payloads -------------------------------------------------------------------------------


#: characters that reorder or hide the text around them (bidi embeddings, overrides, isolates
#: and marks; zero-width spaces and joiners that split words): a key or payload holding them
#: could read as something else ("invoice\u202egpj.exe" shows as "invoiceexe.jpg")
_HIDDEN_CHARS = re.compile("[\u061c\u200b\u200e\u200f\u202a-\u202e\u2060\u2066-\u2069\ufeff]")


def visible(text: str) -> SafeString:
    """``text`` as escaped HTML in which every bidi control and zero-width character is a
    visible mark (``<span class="sq-hidden-char" title="RIGHT-TO-LEFT OVERRIDE">U+202E</span>``)
    instead of acting on the text around it."""
    parts: list[str] = []
    last = 0
    for found in _HIDDEN_CHARS.finditer(text):
        char = found.group()
        parts.append(escape(text[last : found.start()]))
        name = escape(unicodedata.name(char, ""))
        parts.append(f'<span class="sq-hidden-char" title="{name}">U+{ord(char):04X}</span>')
        last = found.end()
    if not parts:
        return escape(text)
    parts.append(escape(text[last:]))
    return mark_safe("".join(parts))  # each part is escaped above


def label_html(label: str) -> SafeString:
    """A queue label (``app_label.Model``) that may wrap after its dot and after the
    underscores of a long app label (``spanner_queues_conformance``), never inside a word."""
    # escaped first
    return mark_safe(escape(label).replace(".", ".<wbr>").replace("_", "_<wbr>"))


def key_text(message: Message) -> SafeString:
    """A message's key as ``name=value, ...``, for display (``visible``)."""
    return visible(", ".join(f"{name}={value}" for name, value in message.key_dict.items()))


@dataclass(frozen=True, slots=True)
class Payload:
    """A payload as shown: ``kind`` is json, text, hex or empty; ``text`` is never HTML."""

    kind: str
    text: str
    size: int

    @property
    def preview(self) -> str:
        flat = " ".join(self.text.split())
        return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"

    @property
    def html(self) -> SafeString:
        """``text`` for display (``visible``)."""
        return visible(self.text)

    @property
    def preview_html(self) -> SafeString:
        """``preview`` for display (``visible``)."""
        return visible(self.preview)


def hex_dump(data: bytes, width: int = 16) -> str:
    lines = []
    for offset in range(0, len(data), width):
        chunk = data[offset : offset + width]
        printable = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {chunk.hex(' '):<{width * 3}} {printable}")
    return "\n".join(lines)


def render_payload(data: bytes, *, pretty: bool = True) -> Payload:
    """Pretty JSON when the payload is JSON, else UTF-8 text, else a hex dump."""
    if not data:
        return Payload("empty", "", 0)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return Payload("hex", hex_dump(data) if pretty else data.hex(" "), len(data))
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # (JSON nested too deeply for Python is text here)
        return Payload("text", text, len(data))
    if not pretty:
        return Payload("json", text, len(data))
    return Payload("json", json.dumps(value, indent=2, ensure_ascii=False), len(data))

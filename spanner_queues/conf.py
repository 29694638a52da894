"""The ``SPANNER_QUEUES`` setting, parsed into frozen values.

    SPANNER_QUEUES = {
        "default": {
            "ENGINE": "spanner_queues.engines.table.TableQueueEngine",
            "DATABASE": "default",
            "OPTIONS": {"LEASE_SECONDS": 10, "MAX_PAYLOAD_BYTES": 4096, "BACKOFF": {...}},
        },
    }

Aliases work like ``DATABASES`` and ``CACHES``: a queue names the alias it lives in
(``QueueMeta.engine``, default ``"default"``).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.utils.module_loading import import_string

from spanner_queues.exceptions import InvalidQueueEngine
from spanner_queues.semantics import LEASE, BackoffPolicy

__all__ = ["BackoffPolicy", "EngineParams", "parse_engine"]

DEFAULT_ENGINE_ALIAS = "default"
TABLE_ENGINE = "spanner_queues.engines.table.TableQueueEngine"
NATIVE_ENGINE = "spanner_queues.engines.native.NativeQueueEngine"
ENGINE_SHORTCUTS = {"table": TABLE_ENGINE, "native": NATIVE_ENGINE}

#: OPTIONS keys every engine understands; engines add their own (``accepted_options``).
COMMON_OPTIONS = frozenset(
    {"LEASE_SECONDS", "BACKOFF", "MAX_PAYLOAD_BYTES", "TRANSACTION_RETRIES", "JSON_ENCODER"}
)

DEFAULT_SETTING: dict[str, dict[str, Any]] = {
    DEFAULT_ENGINE_ALIAS: {"ENGINE": TABLE_ENGINE, "DATABASE": "default"}
}


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineParams:
    """One engine alias, validated."""

    alias: str
    engine: str
    database: str = "default"
    lease: timedelta = LEASE
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    max_payload_bytes: int | None = 4096
    transaction_retries: int = 20
    #: writes every JSON payload of this alias's queues (send, outbox, helpers)
    json_encoder: type[json.JSONEncoder] = DjangoJSONEncoder
    options: Mapping[str, Any] = field(default_factory=dict)


def _seconds(value: Any, name: str, alias: str) -> timedelta:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        seconds = -1.0
    else:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES[{alias!r}]: {name} must be a positive number of seconds, "
            f"not {value!r}."
        )
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES[{alias!r}]: {name} is out of range: {value!r}."
        ) from None


def _json_encoder(value: Any, alias: str) -> type[json.JSONEncoder]:
    """A ``json.JSONEncoder`` subclass, given as the class or its dotted path."""
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise InvalidQueueEngine(
                f"SPANNER_QUEUES[{alias!r}]: JSON_ENCODER {value!r} cannot be imported: {exc}"
            ) from exc
    if not (isinstance(value, type) and issubclass(value, json.JSONEncoder)):
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES[{alias!r}]: JSON_ENCODER must be a json.JSONEncoder subclass "
            f"(or its dotted path), not {value!r}."
        )
    return value


def _backoff(alias: str, backoff_raw: dict[str, Any]) -> BackoffPolicy:
    """``OPTIONS["BACKOFF"]`` of alias ``alias``, validated (defaults: ``BackoffPolicy``'s)."""
    backoff_known = {
        "INITIAL_SECONDS",
        "MULTIPLIER",
        "MAX_SECONDS",
        "HOURLY_AFTER_SECONDS",
        "HOURLY_SECONDS",
        "JITTER",
    }
    if set(backoff_raw) - backoff_known:
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES[{alias!r}]['OPTIONS']['BACKOFF'] has unknown keys: "
            f"{', '.join(sorted(set(backoff_raw) - backoff_known))}."
        )
    defaults = BackoffPolicy()
    multiplier = backoff_raw.get("MULTIPLIER", defaults.multiplier)
    if not isinstance(multiplier, (int, float)) or multiplier < 1:
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES[{alias!r}]: BACKOFF MULTIPLIER must be a number >= 1."
        )
    jitter = backoff_raw.get("JITTER", defaults.jitter)
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter <= 1:
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES[{alias!r}]: BACKOFF JITTER must be a number from 0 to 1."
        )
    return BackoffPolicy(
        jitter=float(jitter),
        initial=_seconds(
            backoff_raw.get("INITIAL_SECONDS", defaults.initial), "INITIAL_SECONDS", alias
        ),
        multiplier=float(multiplier),
        maximum=_seconds(backoff_raw.get("MAX_SECONDS", defaults.maximum), "MAX_SECONDS", alias),
        hourly_after=_seconds(
            backoff_raw.get("HOURLY_AFTER_SECONDS", defaults.hourly_after),
            "HOURLY_AFTER_SECONDS",
            alias,
        ),
        hourly=_seconds(
            backoff_raw.get("HOURLY_SECONDS", defaults.hourly), "HOURLY_SECONDS", alias
        ),
    )


#: the keys of one alias of ``SPANNER_QUEUES``
ALIAS_KEYS = ("ENGINE", "DATABASE", "OPTIONS")


def _alias_key_hint(alias: str, key: str) -> str:
    """What an unknown key of an alias was meant to be: an ``OPTIONS`` key put beside
    ``ENGINE``, else the closest of the alias's keys (difflib), else nothing."""
    if key.upper() in COMMON_OPTIONS:
        return f" {key} is an OPTIONS key: SPANNER_QUEUES[{alias!r}]['OPTIONS'][{key.upper()!r}]."
    closest = difflib.get_close_matches(key.upper(), ALIAS_KEYS, n=1)
    return f" Did you mean {closest[0]}?" if closest else ""


def parse_engine(alias: str, raw: Mapping[str, Any]) -> EngineParams:
    """Validate one alias of ``SPANNER_QUEUES``; raise ``InvalidQueueEngine`` with the reason."""
    if not isinstance(raw, Mapping):
        raise InvalidQueueEngine(f"SPANNER_QUEUES[{alias!r}] must be a dict.")
    unknown = sorted(set(map(str, raw)) - set(ALIAS_KEYS))
    if unknown:
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES[{alias!r}] has unknown keys: {', '.join(unknown)}. Known: "
            f"{', '.join(sorted(ALIAS_KEYS))}.{''.join(_alias_key_hint(alias, k) for k in unknown)}"
        )
    engine = raw.get("ENGINE", TABLE_ENGINE)
    if not isinstance(engine, str) or not engine:
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES[{alias!r}]['ENGINE'] must be a dotted path or one of "
            f"{', '.join(map(repr, ENGINE_SHORTCUTS))}, not {engine!r}."
        )
    if engine not in ENGINE_SHORTCUTS and "." not in engine:  # a misspelt shortcut
        closest = difflib.get_close_matches(engine, ENGINE_SHORTCUTS, n=1)
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES[{alias!r}]['ENGINE'] = {engine!r} is neither a shortcut "
            f"({', '.join(map(repr, ENGINE_SHORTCUTS))}) nor an importable dotted path."
            + (f" Did you mean {closest[0]!r}?" if closest else "")
        )
    engine = ENGINE_SHORTCUTS.get(engine, engine)
    options = dict(raw.get("OPTIONS") or {})
    known = COMMON_OPTIONS
    backoff = _backoff(alias, dict(options.get("BACKOFF") or {}))
    max_payload = options.get("MAX_PAYLOAD_BYTES", 4096)
    if max_payload is not None and (not isinstance(max_payload, int) or max_payload <= 0):
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES[{alias!r}]: MAX_PAYLOAD_BYTES must be a positive int or None."
        )
    retries = options.get("TRANSACTION_RETRIES", 20)
    if not isinstance(retries, int) or retries < 0:
        raise InvalidQueueEngine(
            f"SPANNER_QUEUES[{alias!r}]: TRANSACTION_RETRIES must be an int >= 0."
        )
    return EngineParams(
        json_encoder=_json_encoder(options.get("JSON_ENCODER", DjangoJSONEncoder), alias),
        alias=alias,
        engine=engine,
        database=raw.get("DATABASE", "default"),
        lease=_seconds(options.get("LEASE_SECONDS", 10), "LEASE_SECONDS", alias),
        backoff=backoff,
        max_payload_bytes=max_payload,
        transaction_retries=retries,
        options={k: v for k, v in options.items() if k not in known},
    )


#: the shortest interval between reads of the queue gauges and depth samples, in seconds
#: (``runqueueworker --metrics-interval``; the metrics app's ``SAMPLE_INTERVAL_SECONDS``)
MIN_SAMPLE_INTERVAL = 1.0

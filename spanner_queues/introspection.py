"""Keep native queues out of Django's table listings: installs, from ``AppConfig.ready``, a
``connection_created`` hook that hands every new connection of a Spanner database to its driver
(``Driver.connection_created``: on Spanner one client ``Database`` per process and database)
and to the engines on its database (``BaseQueueEngine.connection_created``: the native engine
wraps its introspection).

Django-facing: which declared queues live on a connection's database is asked through the engine
seam (``engine.features.supports_native_queues``, ``engine.database``).
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from django.db.backends.signals import connection_created
from django.utils.module_loading import import_string

from spanner_queues.conf import parse_engine
from spanner_queues.drivers import driver_of
from spanner_queues.engines import engine_for, engines
from spanner_queues.queues import queue_models


def native_queue_tables(alias: str) -> set[str]:
    """Lower-cased table names of the declared queues that live natively on ``alias``."""
    names = set()
    for model in queue_models():
        try:
            engine = engine_for(model)
        except Exception:  # a misconfigured alias is reported by the system checks
            continue
        if engine.features.supports_native_queues and engine.database == alias:
            names.add(model._meta.db_table.lower())
    return names


#: the configured engines whose class is native, as (engine alias, database alias), found once
#: per state of the settings (``engines.settings`` is a new dict after a settings change)
_native: tuple[object, list[tuple[str, str]]] | None = None


def _native_engines() -> list[tuple[str, str]]:
    """(engine alias, database alias) of each engine whose class has native queues: a new
    thread's connection builds no engine it does not hand the connection to."""
    global _native
    configured = engines.settings
    found = _native
    if found is None or found[0] is not configured:
        pairs = []
        for name in configured:
            try:
                params = parse_engine(name, configured[name])
                engine_class = import_string(params.engine)
            except Exception:  # a misconfigured alias is reported by the system checks
                continue
            features = getattr(engine_class, "features", None)
            if features is not None and features.supports_native_queues:
                pairs.append((name, params.database))
        found = _native = (configured, pairs)
    return found[1]


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    alias = connection.alias
    driver_of(connection).connection_created()  # (Spanner: one client Database per thread)
    for name, database in _native_engines():
        if database != alias:
            continue
        try:
            engine = engines[name]
        except Exception:  # a misconfigured alias is reported by the system checks
            continue
        engine.connection_created(connection, lambda: native_queue_tables(alias))


def connect() -> None:
    """Install the hook for every future connection of the configured databases whose driver
    acts on one (``Driver.acts_on_new_connections``: Spanner, where native queues live),
    by backend class (called from ``AppConfig.ready``; no connection is opened). Elsewhere a
    new connection calls nothing of this app."""
    for alias in connections:
        wrapper = connections[alias]
        if driver_of(wrapper).acts_on_new_connections:
            cls = type(wrapper)
            connection_created.connect(
                _on_connection_created,
                sender=cls,
                dispatch_uid=f"spanner_queues.introspection.{cls.__module__}",
            )

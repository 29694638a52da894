"""Keep native queues out of Django's table listings: installs, from ``AppConfig.ready``, a
``connection_created`` hook that wraps the introspection of every connection to a database
holding native queues (``spanner_queues.native.introspection.wrap``).

Django-facing: which connections hold native queues, and which declared queues live there, is
asked through the engine seam (``engine.features.supports_native_queues``, ``engine.database``).
"""

from __future__ import annotations

from typing import Any

from django.db.backends.signals import connection_created

from spanner_queues.drivers import driver_for
from spanner_queues.engines import engines
from spanner_queues.registry import engine_for, queue_models


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


def _native_aliases() -> set[str]:
    aliases = set()
    for name in engines.settings:
        try:
            engine = engines[name]
        except Exception:
            continue
        if engine.features.supports_native_queues:
            aliases.add(engine.database)
    return aliases


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    if (
        connection.alias in _native_aliases()
        and driver_for(connection.alias).supports_native_queues
    ):
        # (here, not at the top: the client loads google-cloud-spanner, which a project with
        # no native queue need not import)
        from spanner_queues.native import client, introspection

        introspection.wrap(connection, native_queue_tables)
        # the client's streaming reads (the cursor's queries) retry UNAVAILABLE for ever
        database = getattr(connection.connection, "database", None)
        if database is not None:
            client.bound_streaming_reads(database)


def connect() -> None:
    """Install the hook for every future connection (called from ``AppConfig.ready``)."""
    connection_created.connect(
        _on_connection_created, dispatch_uid="spanner_queues.native.introspection"
    )

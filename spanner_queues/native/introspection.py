"""Keep native queues out of Django's table listings (``flush``, ``inspectdb``, migrations).

django_spanner lists every row of ``information_schema.tables`` and calls everything that is
not a ``VIEW`` a table, so a queue would be flushed with ``DELETE`` like a table and turned into
a model by ``inspectdb``. When a connection to a database that holds native queues is created,
its introspection's ``get_table_list`` is wrapped: queues are reported with type ``"q"``, which
Django's ``table_names()``, ``flush`` and ``inspectdb`` skip (they take ``"t"``, and ``"v"`` only
when asked for views). A relation is a queue when a declared queue model on a native engine
names it, or when ``information_schema.tables`` gives it a type other than ``BASE TABLE`` or
``VIEW`` (the value Spanner uses for queues is not documented).
"""

from __future__ import annotations

from typing import Any

from django.db.backends.base.introspection import TableInfo
from django.db.backends.signals import connection_created

QUEUE = "q"
_OTHER_TYPES_SQL = (
    "SELECT t.table_name FROM information_schema.tables AS t "
    "WHERE t.table_catalog = '' AND t.table_schema = '' "
    "AND t.table_type NOT IN ('BASE TABLE', 'VIEW')"
)


def native_queue_tables(alias: str) -> set[str]:
    """Lower-cased table names of the declared queues that live natively on ``alias``."""
    from spanner_queues.registry import engine_for, queue_models

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
    from spanner_queues.engines import engines

    aliases = set()
    for name in engines.settings:
        try:
            engine = engines[name]
        except Exception:
            continue
        if engine.features.supports_native_queues:
            aliases.add(engine.database)
    return aliases


def wrap(connection: Any) -> None:
    """Make ``connection.introspection.get_table_list`` label queues ``"q"`` (idempotent)."""
    introspection = connection.introspection
    if getattr(introspection, "_spanner_queues_wrapped", False):
        return
    original = introspection.get_table_list
    alias = connection.alias

    def get_table_list(cursor: Any) -> list[TableInfo]:
        queues = native_queue_tables(alias)
        runner = getattr(cursor, "run_sql_in_snapshot", None)
        if runner is None:  # a Django cursor wrapper: reach the DB-API cursor
            runner = getattr(getattr(cursor, "cursor", None), "run_sql_in_snapshot", None)
        if runner is not None:
            queues |= {str(row[0]).lower() for row in runner(_OTHER_TYPES_SQL)}
        return [
            TableInfo(info.name, QUEUE) if info.name.lower() in queues else info
            for info in original(cursor)
        ]

    introspection.get_table_list = get_table_list
    introspection._spanner_queues_wrapped = True


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    from spanner_queues.drivers import driver_for

    if (
        connection.alias in _native_aliases()
        and driver_for(connection.alias).supports_native_queues
    ):
        wrap(connection)


def connect() -> None:
    """Install the hook for every future connection (called from ``AppConfig.ready``)."""
    connection_created.connect(
        _on_connection_created, dispatch_uid="spanner_queues.native.introspection"
    )

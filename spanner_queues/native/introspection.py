"""Keep native queues out of Django's table listings (``flush``, ``inspectdb``, migrations).

django_spanner lists every row of ``information_schema.tables`` and calls everything that is
not a ``VIEW`` a table, so a queue would be flushed with ``DELETE`` like a table and turned into
a model by ``inspectdb``. When a connection to a database that holds native queues is created,
its introspection's ``get_table_list`` is wrapped: queues are reported with type ``"q"``, which
Django's ``table_names()``, ``flush`` and ``inspectdb`` skip (they take ``"t"``, and ``"v"`` only
when asked for views). A relation is a queue when a declared queue model on a native engine
names it, or when ``information_schema.tables`` gives it a type other than ``BASE TABLE`` or
``VIEW`` (the value Spanner uses for queues is not documented).

This module knows Spanner's ``information_schema``; which queues are declared, and on which
connections, is asked through the engines by ``spanner_queues.introspection``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.backends.base.introspection import TableInfo

QUEUE = "q"
_OTHER_TYPES_SQL = (
    "SELECT t.table_name FROM information_schema.tables AS t "
    "WHERE t.table_catalog = '' AND t.table_schema = '' "
    "AND t.table_type NOT IN ('BASE TABLE', 'VIEW')"
)


def wrap(connection: Any, declared_queues: Callable[[str], set[str]]) -> None:
    """Make ``connection.introspection.get_table_list`` label queues ``"q"`` (idempotent).
    ``declared_queues(alias)`` gives the lower-cased names of the declared queues that live
    natively on the connection's database."""
    introspection = connection.introspection
    if getattr(introspection, "_spanner_queues_wrapped", False):
        return
    original = introspection.get_table_list
    alias = connection.alias

    def get_table_list(cursor: Any) -> list[TableInfo]:
        queues = declared_queues(alias)
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

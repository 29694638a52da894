"""Engine aliases from ``SPANNER_QUEUES``, in the style of ``django.db.connections``."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.utils.connection import BaseConnectionHandler
from django.utils.module_loading import import_string

from spanner_queues.conf import DEFAULT_SETTING, parse_engine
from spanner_queues.engines.base import BaseQueueEngine, EngineFeatures, QueueStats, SpannerSQL
from spanner_queues.exceptions import InvalidQueueEngine
from spanner_queues.options import queue_options

if TYPE_CHECKING:
    from asgiref.local import Local
    from django.db.models import Model

__all__ = ["BaseQueueEngine", "EngineFeatures", "QueueStats", "engine_for", "engines"]


class EngineHandler(BaseConnectionHandler):
    settings_name = "SPANNER_QUEUES"
    exception_class = InvalidQueueEngine
    # set by BaseConnectionHandler.__init__ (django-stubs leaves them out); a settings change
    # replaces both (apps._reset_engines) and engine_for compares the storage
    _settings: dict[str, Any] | None
    _connections: Local

    def configure_settings(self, settings_dict: dict[str, Any] | None) -> dict[str, Any]:
        configured = getattr(settings, "SPANNER_QUEUES", None)
        return dict(configured if configured is not None else DEFAULT_SETTING)

    def create_connection(self, alias: str) -> BaseQueueEngine:
        params = parse_engine(alias, self.settings[alias])
        try:
            engine_class = import_string(params.engine)
        except ImportError as exc:
            raise InvalidQueueEngine(
                f"SPANNER_QUEUES[{alias!r}]['ENGINE'] = {params.engine!r} cannot be imported: {exc}"
            ) from exc
        if not (isinstance(engine_class, type) and issubclass(engine_class, BaseQueueEngine)):
            raise InvalidQueueEngine(f"{params.engine!r} is not a BaseQueueEngine subclass.")
        return engine_class(params)


engines = EngineHandler()


#: this thread's engines by alias, with the handler's storage they came from: one dict lookup
#: instead of ``engines[alias]``'s context-aware ``Local`` (a few microseconds on every send);
#: a settings change replaces that storage (``apps._reset_engines``), which empties this cache
_this_thread = threading.local()


def engine_for(model: type[Model]) -> BaseQueueEngine:
    """The engine the queue's ``QueueMeta.engine`` alias names (this thread's, as
    ``engines[alias]``)."""
    alias = queue_options(model).engine
    # the None key holds the storage the engines came from; the others are aliases
    cache = cast("dict[str | None, Any]", _this_thread.__dict__)
    storage = engines._connections
    if cache.get(None) is not storage:
        cache.clear()
        cache[None] = storage
    engine = cache.get(alias)
    if engine is None:
        engine = cache[alias] = engines[alias]
    return engine


#: where the SQL text of Spanner's dialects lives (beside the engines, outside the native engine's
#: package, which imports Google's client: ``queuegrants`` prints it without the `spanner` extra;
#: loaded by name, when asked)
SPANNER_SQL = "spanner_queues.engines.spanner_ddl.dialect"


def spanner_sql(dialect: str) -> SpannerSQL:
    """The names Spanner's ``dialect`` (``"googlesql"`` or ``"postgresql"``) gives a queue's
    objects, for callers that print SQL (``queuegrants``) without reaching into an engine:
    ``quote(name)``, ``receive_function(queue)``, ``renew_function(queue)``.
    ``QueueConfigurationError`` for another dialect."""
    return cast("SpannerSQL", import_string(SPANNER_SQL)(dialect))

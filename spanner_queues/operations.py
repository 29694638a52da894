"""Migration operations for queues. ``makemigrations`` (as extended by this app) writes them in
place of ``CreateModel``/``DeleteModel`` for ``Queue`` models; the configured engine decides the
DDL (an ordinary table, or ``CREATE QUEUE`` on Spanner), so one migration serves every engine.
``sqlmigrate`` prints the statements, as for any operation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.migrations.operations import CreateModel, DeleteModel
from django.db.migrations.operations.base import Operation

from spanner_queues.conf import DEFAULT_ENGINE_ALIAS
from spanner_queues.engines import engines
from spanner_queues.options import KNOWN_OPTIONS, QueueOptions

__all__ = ["CreateQueue", "DeleteQueue"]


def _options(raw: dict[str, Any] | None) -> QueueOptions:
    raw = dict(raw or {})
    return QueueOptions(**{k: v for k, v in raw.items() if k in KNOWN_OPTIONS})


def _engine(raw: dict[str, Any], database: str, *, by_database: bool) -> Any:
    """The engine of a queue operation: the ``engine`` option, else ``default``. With
    ``by_database`` (``DeleteQueue``, which makemigrations writes without options because the
    model is gone), an engine whose DATABASE is the migrated one, preferring ``default``."""
    if "engine" in raw or not by_database:
        return engines[raw.get("engine", DEFAULT_ENGINE_ALIAS)]
    aliases = sorted(engines.settings, key=lambda a: a != DEFAULT_ENGINE_ALIAS)
    for alias in aliases:
        if engines[alias].database == database:
            return engines[alias]
    return engines[aliases[0]]


class _QueueOperation(Operation):
    """Runs an engine's DDL verb for a queue, only in the engine's own database (a mixin of
    the model operation it is listed before)."""

    name: str  # the model's, set by the model operation
    queue_options: dict[str, Any]
    by_database = False

    def _run(self, verb: str, app_label: str, schema_editor: Any, state: Any) -> None:
        model = state.apps.get_model(app_label, self.name)
        alias = schema_editor.connection.alias
        engine = _engine(self.queue_options, alias, by_database=self.by_database)
        if engine.database == alias and self.allow_migrate_model(alias, model):
            getattr(engine, verb)(schema_editor, model, _options(self.queue_options))


class CreateQueue(_QueueOperation, CreateModel):
    """Create a queue model's storage through its engine."""

    def __init__(
        self,
        name: str,
        fields: Any,
        options: Any = None,
        bases: Any = None,
        managers: Any = None,
        queue_options: dict | None = None,
    ) -> None:
        # An explicit signature: the migration writer serialises only named parameters.
        self.queue_options = dict(queue_options or {})
        super().__init__(name, fields, options=options, bases=bases, managers=managers)

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        _name, args, kwargs = super().deconstruct()
        if self.queue_options:
            kwargs["queue_options"] = self.queue_options
        return self.__class__.__name__, args, kwargs

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._run("create_queue", app_label, schema_editor, to_state)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._run("drop_queue", app_label, schema_editor, from_state)

    def describe(self) -> str:
        return f"Create queue {self.name}"

    def reduce(self, operation: Any, app_label: str) -> Any:
        # Keep CreateQueue a CreateQueue when squashed with later field operations.
        reduced = super().reduce(operation, app_label)
        if isinstance(reduced, list) and len(reduced) == 1 and type(reduced[0]) is CreateModel:
            op = reduced[0]
            return [
                CreateQueue(
                    op.name,
                    op.fields,
                    options=op.options,
                    bases=op.bases,
                    managers=op.managers,
                    queue_options=self.queue_options,
                )
            ]
        return reduced


class DeleteQueue(_QueueOperation, DeleteModel):
    """Drop a queue model's storage through its engine."""

    by_database = True

    def __init__(self, name: str, *, queue_options: dict | None = None) -> None:
        self.queue_options = dict(queue_options or {})
        super().__init__(name)

    def deconstruct(self) -> tuple[str, Sequence[Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {"name": self.name}
        if self.queue_options:
            kwargs["queue_options"] = self.queue_options
        return self.__class__.__name__, [], kwargs

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._run("drop_queue", app_label, schema_editor, from_state)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._run("create_queue", app_label, schema_editor, to_state)

    def describe(self) -> str:
        return f"Delete queue {self.name}"

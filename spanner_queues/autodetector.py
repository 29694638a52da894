"""A migration autodetector that writes ``CreateQueue``/``DeleteQueue`` for queue models."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.apps import apps as global_apps
from django.db.migrations.autodetector import MigrationAutodetector
from django.db.migrations.operations import CreateModel, DeleteModel

from spanner_queues.operations import CreateQueue, DeleteQueue
from spanner_queues.options import QueueOptions, queue_options
from spanner_queues.storage import QueueManager

#: the QueueMeta options that change DDL, and so are written into migrations.
SCHEMA_OPTIONS = ("engine", "interleave_in_parent", "native_options", "row_deletion_policy")


def _is_queue_state(state: Any, app_label: str, name: str) -> bool:
    model_state = state.models.get((app_label, name.lower()))
    return model_state is not None and any(
        isinstance(manager, QueueManager) for _, manager in model_state.managers
    )


def _declared_options(app_label: str, name: str) -> dict[str, Any]:
    try:
        model = global_apps.get_model(app_label, name)
    except LookupError:
        return {}
    return declared_schema_options(model)


def declared_schema_options(model: Any) -> dict[str, Any]:
    """The model's ``QueueMeta`` options that change DDL, leaving out defaults."""
    defaults = asdict(QueueOptions())
    declared = asdict(queue_options(model))
    return {
        k: (dict(v) if k in ("native_options", "row_deletion_policy") else v)
        for k, v in declared.items()
        if k in SCHEMA_OPTIONS and v != defaults[k]
    }


class QueueAutodetector(MigrationAutodetector):
    def add_operation(
        self, app_label: str, operation: Any, dependencies: Any = None, beginning: bool = False
    ) -> None:
        if type(operation) is CreateModel and _is_queue_state(
            self.to_state, app_label, operation.name
        ):
            operation = CreateQueue(
                operation.name,
                operation.fields,
                options=operation.options,
                bases=operation.bases,
                managers=operation.managers,
                queue_options=_declared_options(app_label, operation.name),
            )
        elif type(operation) is DeleteModel and _is_queue_state(
            self.from_state, app_label, operation.name
        ):
            operation = DeleteQueue(operation.name)
        super().add_operation(app_label, operation, dependencies, beginning)

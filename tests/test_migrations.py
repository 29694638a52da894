"""Queues are created by migrations: makemigrations writes CreateQueue/DeleteQueue, sqlmigrate
prints the engine's DDL, and the operations serialise and reverse."""

from __future__ import annotations

import io

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.db.migrations.state import ModelState, ProjectState
from django.db.migrations.writer import MigrationWriter

from spanner_queues.autodetector import QueueAutodetector
from spanner_queues.drivers import driver_for
from spanner_queues.engines import engines
from spanner_queues.operations import CreateQueue, DeleteQueue


def _state(*labels: str) -> ProjectState:
    state = ProjectState()
    for label in labels:
        state.add_model(ModelState.from_model(apps.get_model(label)))
    return state


@pytest.mark.engine_independent
def test_autodetector_writes_queue_operations() -> None:
    with_queue = _state("testapp.Jobs", "testapp.Account")
    without = _state("testapp.Account")
    created = QueueAutodetector(without, with_queue)._detect_changes()["testapp"][0].operations
    assert [type(op).__name__ for op in created] == ["CreateQueue"]
    deleted = QueueAutodetector(with_queue, without)._detect_changes()["testapp"][0].operations
    assert [type(op).__name__ for op in deleted] == ["DeleteQueue"]
    assert deleted[0].describe() == "Delete queue Jobs"


@pytest.mark.engine_independent
def test_row_deletion_policy_is_a_schema_option_written_into_migrations() -> None:
    from django.db import models
    from django.test.utils import isolate_apps

    from spanner_queues.autodetector import declared_schema_options
    from spanner_queues.models import Queue

    policy = {"older_than": "deliver_time", "days": 7}
    with isolate_apps("tests.testapp"):

        class Expiring(Queue):
            Meta = type("Meta", (), {"app_label": "testapp"})
            id = models.CharField(max_length=10, primary_key=True)

            class QueueMeta:
                row_deletion_policy = policy

        assert declared_schema_options(Expiring) == {"row_deletion_policy": policy}


@pytest.mark.engine_independent
def test_create_queue_serialises_with_its_options() -> None:
    op = CreateQueue("Q", [], queue_options={"interleave_in_parent": "upload"})
    text, imports = MigrationWriter.serialize(op)
    assert "spanner_queues.operations.CreateQueue(" in text
    assert "queue_options={'interleave_in_parent': 'upload'}" in text
    assert "import spanner_queues.operations" in imports
    op2 = DeleteQueue("Q", queue_options={"engine": "other"})
    assert op2.deconstruct() == (
        "DeleteQueue",
        [],
        {"name": "Q", "queue_options": {"engine": "other"}},
    )


@pytest.mark.django_db
def test_no_missing_migrations() -> None:
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db(transaction=True)
def test_sqlmigrate_prints_the_engine_ddl() -> None:
    out = io.StringIO()
    call_command("sqlmigrate", "testapp", "0001", stdout=out)
    sql = out.getvalue()
    assert "-- Create queue UserTasks" in sql
    if engines["default"].features.supports_native_queues:  # Spanner creates DeliverTime
        assert "CREATE QUEUE testapp_usertasks" in sql and "Payload BYTES(MAX) NOT NULL" in sql
    else:
        assert "CREATE TABLE" in sql and "DeliverTime" in sql and "Payload" in sql
    if driver_for(connection.alias).supports_interleave:
        assert "INTERLEAVE IN PARENT" in sql
    else:
        assert "INTERLEAVE" not in sql

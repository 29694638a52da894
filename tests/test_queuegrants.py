"""``manage.py queuegrants`` prints the fine-grained access grants of a sender and a worker role,
in both dialects, for native and table-engine queues (it reads no database)."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from spanner_queues.conf import parse_engine
from spanner_queues.engines.native import NativeQueueEngine

pytestmark = pytest.mark.engine_independent  # prints statements; no database is read


def grants(*args: str) -> str:
    out = StringIO()
    call_command("queuegrants", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def native(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every queue on a native engine of the given dialect (built, never connected)."""

    def use(dialect: str) -> None:
        engine = NativeQueueEngine(
            parse_engine("native", {"ENGINE": "native", "OPTIONS": {"DIALECT": dialect}})
        )
        monkeypatch.setattr(
            "spanner_queues.management.commands.queuegrants.engine_for", lambda model: engine
        )

    return use


ROLES = ("--role-sender", "web", "--role-worker", "worker")
#: the tasks app's results table
RESULTS = "spanner_queues_tasks_taskresultrecord"


def test_native_queue_grants_in_googlesql(native: Any) -> None:
    native("googlesql")
    assert grants(*ROLES, "--queue", "testapp.Emails", "--queue", "testapp.UserTasks") == (
        "-- spanner_queues: fine-grained access control for 2 queue(s), GoogleSQL dialect\n"
        "-- sender role web (web processes), worker role worker (runqueueworker)\n"
        "-- testapp.Emails: native queue testapp_emails\n"
        "GRANT INSERT ON QUEUE testapp_emails TO ROLE web;\n"
        "GRANT SELECT, INSERT, DELETE ON QUEUE testapp_emails TO ROLE worker;\n"
        "GRANT EXECUTE ON TABLE FUNCTION RECEIVE_testapp_emails TO ROLE worker;\n"
        "GRANT EXECUTE ON TABLE FUNCTION RENEWLEASE_testapp_emails TO ROLE worker;\n"
        "-- testapp.Emails dead-letters into testapp.EmailsDead\n"
        "GRANT INSERT ON QUEUE testapp_emailsdead TO ROLE worker;\n"
        "-- testapp.UserTasks: native queue testapp_usertasks\n"
        "GRANT INSERT ON QUEUE testapp_usertasks TO ROLE web;\n"
        "GRANT SELECT, INSERT, DELETE ON QUEUE testapp_usertasks TO ROLE worker;\n"
        "GRANT EXECUTE ON TABLE FUNCTION RECEIVE_testapp_usertasks TO ROLE worker;\n"
        "GRANT EXECUTE ON TABLE FUNCTION RENEWLEASE_testapp_usertasks TO ROLE worker;\n"
        "-- spanner_queues' own tables\n"
        "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE spanner_queues_faileddelivery "
        "TO ROLE worker;\n"
        "GRANT SELECT, INSERT, DELETE ON TABLE spanner_queues_queuedepthsample TO ROLE worker;\n"
        "GRANT SELECT ON TABLE spanner_queues_pausedqueue TO ROLE worker;\n"
        "GRANT SELECT, INSERT, DELETE ON TABLE spanner_queues_pausedqueue TO ROLE web;\n"
        "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE spanner_queues_sentkey TO ROLE web;\n"
        "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE spanner_queues_sentkey TO ROLE worker;\n"
        "-- and the tables your receivers write, to worker\n"
    )


def test_native_queue_grants_in_postgresql(native: Any) -> None:
    native("postgresql")
    assert grants(*ROLES, "--queue", "testapp.UserTasks", "--create-roles") == (
        "-- spanner_queues: fine-grained access control for 1 queue(s), PostgreSQL dialect\n"
        "-- sender role web (web processes), worker role worker (runqueueworker)\n"
        "CREATE ROLE web;\n"
        "CREATE ROLE worker;\n"
        "-- testapp.UserTasks: native queue testapp_usertasks\n"
        "GRANT INSERT ON QUEUE testapp_usertasks TO web;\n"
        "GRANT SELECT, INSERT, DELETE ON QUEUE testapp_usertasks TO worker;\n"
        "GRANT EXECUTE ON FUNCTION spanner.receive_testapp_usertasks TO worker;\n"
        "GRANT EXECUTE ON FUNCTION spanner.renewlease_testapp_usertasks TO worker;\n"
        "-- spanner_queues' own tables\n"
        "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE spanner_queues_faileddelivery TO worker;\n"
        "GRANT SELECT, INSERT, DELETE ON TABLE spanner_queues_queuedepthsample TO worker;\n"
        "GRANT SELECT ON TABLE spanner_queues_pausedqueue TO worker;\n"
        "GRANT SELECT, INSERT, DELETE ON TABLE spanner_queues_pausedqueue TO web;\n"
        "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE spanner_queues_sentkey TO web;\n"
        "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE spanner_queues_sentkey TO worker;\n"
        "-- and the tables your receivers write, to worker\n"
    )


def test_dialect_option_overrides_the_engines_dialect(native: Any) -> None:
    native("postgresql")
    text = grants(*ROLES, "--queue", "testapp.UserTasks", "--dialect", "googlesql")
    assert "GRANT EXECUTE ON TABLE FUNCTION RECEIVE_testapp_usertasks TO ROLE worker;" in text


def test_table_engine_queue_grants_table_privileges_and_no_functions() -> None:
    text = grants(*ROLES, "--queue", "testapp.UserTasks", "--dialect", "postgresql")
    assert text == (
        "-- spanner_queues: fine-grained access control for 1 queue(s), PostgreSQL dialect\n"
        "-- sender role web (web processes), worker role worker (runqueueworker)\n"
        "-- testapp.UserTasks: table-engine queue testapp_usertasks\n"
        "GRANT INSERT ON TABLE testapp_usertasks TO web;\n"
        "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE testapp_usertasks TO worker;\n"
        "-- spanner_queues' own tables\n"
        "GRANT SELECT, INSERT, DELETE ON TABLE spanner_queues_queuedepthsample TO worker;\n"
        "GRANT SELECT ON TABLE spanner_queues_pausedqueue TO worker;\n"
        "GRANT SELECT, INSERT, DELETE ON TABLE spanner_queues_pausedqueue TO web;\n"
        "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE spanner_queues_sentkey TO web;\n"
        "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE spanner_queues_sentkey TO worker;\n"
        "-- and the tables your receivers write, to worker\n"
    )


def test_task_queue_adds_the_task_results_table(native: Any) -> None:
    native("googlesql")
    text = grants(*ROLES, "--queue", "spanner_queues_tasks.TaskMessage")
    assert f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {RESULTS} TO ROLE worker;" in text
    assert f"GRANT SELECT, DELETE ON TABLE {RESULTS} TO ROLE web;" in text


def test_every_declared_queue_by_default(native: Any) -> None:
    from spanner_queues.queues import queue_models

    native("googlesql")
    text = grants(*ROLES)
    for model in queue_models():
        assert f"GRANT INSERT ON QUEUE {model._meta.db_table} TO ROLE web;" in text


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("--queue", "nope.Nothing"), "nope.Nothing"),
        (("--role-sender", "same", "--role-worker", "same"), "two roles"),
    ],
)
def test_refusals(args: tuple[str, ...], error: str) -> None:
    if "--role-sender" not in args:
        args = (*ROLES, *args)
    with pytest.raises(CommandError, match=error):
        grants(*args)


def test_role_names_are_checked() -> None:
    with pytest.raises(CommandError, match="not a database role name"):
        grants("--role-sender", "web; DROP TABLE x", "--role-worker", "worker")


def test_a_rate_limited_queue_adds_the_rate_buckets_table(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from spanner_queues import options
    from tests.testapp.models import UserTasks

    real = options.queue_options
    monkeypatch.setattr(
        options,
        "queue_options",
        lambda m: dataclasses.replace(real(m), rate_limit=5) if m is UserTasks else real(m),
    )
    text = grants(*ROLES, "--queue", "testapp.UserTasks", "--dialect", "postgresql")
    assert "GRANT SELECT, INSERT, UPDATE ON TABLE spanner_queues_queuerate TO worker;\n" in text
    assert "queuerate" not in grants(*ROLES, "--queue", "testapp.Jobs")


def test_a_task_queue_of_your_own_adds_the_task_results_table(native: Any) -> None:
    # QUEUE_MODELS gives tasks a queue of the project's own: its workers write the results
    # too. Only the backend's default queue (TaskMessage) added the results table, so a worker
    # role granted for tasksapp.EmailTasks could not record a task RUNNING.
    native("googlesql")
    text = grants(*ROLES, "--queue", "tasksapp.EmailTasks")
    assert f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {RESULTS} TO ROLE worker;" in text
    assert f"{RESULTS} TO ROLE web;" in text

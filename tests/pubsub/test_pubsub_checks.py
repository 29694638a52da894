"""The checks of the Pub/Sub app: E303 (declared or configured without the app installed, from
the core), E301 (a wrong setting), E302 (a queue the app cannot run)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from spanner_queues.contrib.pubsub import conf
from spanner_queues.contrib.pubsub.conf import check_queues, check_setting, parse_pubsub
from spanner_queues.exceptions import InvalidQueueEngine
from spanner_queues.options import QueueOptions
from tests.children import ROOT
from tests.pubsubapp.models import BillingInbox, OrderEvents


def test_without_the_app_check_reports_the_declared_queues_and_the_setting() -> None:
    code = (
        "import django, tests.settings_pubsub as base\n"
        "from django.conf import settings\n"
        "from django.core.management import call_command\n"
        "own = {k: getattr(base, k) for k in dir(base) if k.isupper()}\n"
        "own['INSTALLED_APPS'].remove('spanner_queues.contrib.pubsub')\n"
        # the drill's Pub/Sub queues would be reported too: this test counts pubsubapp's
        "own['INSTALLED_APPS'].remove('spanner_queues.contrib.drill.pubsub')\n"
        "settings.configure(**own)\n"
        "django.setup()\n"
        "try:\n"
        "    call_command('check')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    ).stdout
    # the setting, the two topics (OrderEvents, OrderedOrderEvents), the two subscriptions
    # (BillingInbox, OrderedBillingInbox)
    assert out.count("spanner_queues.E303") == 5, out
    assert "pubsubapp.OrderEvents" in out and "pubsubapp.BillingInbox" in out, out


@pytest.mark.parametrize(
    "raw",
    [[], {"PROJECTS": "x"}, {"PROJECT": ""}, {"DEDUP_WINDOW_DAYS": 0}, {"PULL_MAX_MESSAGES": 5000}],
)
def test_a_wrong_setting_is_e301(raw: Any, settings: Any) -> None:
    with pytest.raises(InvalidQueueEngine):
        parse_pubsub(raw)
    settings.SPANNER_QUEUES_PUBSUB = raw
    [error] = check_setting()
    assert error.id == "spanner_queues.E301"


def test_the_project_defaults_to_google_cloud_project(settings: Any, monkeypatch: Any) -> None:
    settings.SPANNER_QUEUES_PUBSUB = {}
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "from-env")
    assert conf.resource_path("topics", "orders") == "projects/from-env/topics/orders"
    assert conf.resource_path("topics", "projects/p/topics/t") == "projects/p/topics/t"


def declared(monkeypatch: Any, model: Any, **options: Any) -> None:
    real = conf.queue_options

    def fake(m: Any) -> QueueOptions:
        return QueueOptions(**options) if m is model else real(m)

    monkeypatch.setattr(conf, "queue_options", fake)


@pytest.mark.parametrize(
    ("model", "options", "says"),
    [
        (OrderEvents, {"pubsub_topic": "orders"}, "needs a dead_letter_queue"),
        (
            OrderEvents,
            {"pubsub_topic": "top", "pubsub_subscription": "sub", "dead_letter_queue": "x"},
            "either relayed",
        ),
        (
            OrderEvents,
            {"pubsub_topic": "top", "dead_letter_queue": "x", "pubsub_ordering_key": ("nope",)},
            "pubsub_ordering_key must be",
        ),
        (OrderEvents, {"pubsub_subscription": "sub"}, "exactly one key field"),
        (
            BillingInbox,
            {"pubsub_subscription": "sub", "ordered_by": ("event_id",)},
            "An ordered inbox queue (pubsub_subscription and ordered_by) needs two key fields",
        ),
        (
            OrderEvents,  # (order: a BigIntegerField, message_id)
            {"pubsub_subscription": "sub", "ordered_by": ("order",)},
            "CharFields: the Pub/Sub ordering key",
        ),
        (BillingInbox, {"pubsub_ordering_key": ()}, "needs pubsub_topic"),
        (
            BillingInbox,
            {"pubsub_subscription": "sub", "envelope": "cloudevents"},
            "would wrap it a second time",
        ),
    ],
)
def test_a_queue_the_app_cannot_run_is_e302(monkeypatch, model, options, says) -> None:
    declared(monkeypatch, model, **options)
    errors = [e for e in check_queues() if e.obj is model]
    assert errors and all(e.id == "spanner_queues.E302" for e in errors)
    assert any(says in e.msg for e in errors), [e.msg for e in errors]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"pubsub_topic": "orders!"}, "3 to 255 characters"),
        ({"pubsub_topic": "1orders"}, "starts with a letter"),
        ({"pubsub_topic": "ab"}, "3 to 255 characters"),
        ({"pubsub_topic": "google-orders"}, "may not start with 'goog'"),
        ({"pubsub_topic": "projects/p/subscriptions/orders"}, "projects/<project>/topics/<id>"),
        ({"pubsub_topic": "projects/p/topics/or ders"}, "3 to 255 characters"),
    ],
)
def test_a_topic_id_pubsub_would_refuse_is_e302(monkeypatch, options, says) -> None:
    # before: "orders!" passed `check`, and Pub/Sub refused every publish (INVALID_ARGUMENT)
    declared(monkeypatch, OrderEvents, dead_letter_queue="x", **options)
    errors = [e for e in check_queues() if e.obj is OrderEvents]
    assert [e.id for e in errors] == ["spanner_queues.E302"], [e.msg for e in errors]
    assert says in errors[0].msg and "resource_names" in errors[0].hint


def test_a_malformed_subscription_id_is_e302(monkeypatch) -> None:
    declared(monkeypatch, BillingInbox, pubsub_subscription="billing sub")
    errors = [e for e in check_queues() if e.obj is BillingInbox]
    assert any("QueueMeta.pubsub_subscription 'billing sub'" in e.msg for e in errors)


def test_the_test_apps_declarations_pass() -> None:
    assert check_queues() == [] and check_setting() == []


def test_a_window_longer_than_spanners_row_deletion_policy_is_w304(
    settings: Any, monkeypatch: Any
) -> None:
    """On Spanner the SeenEvent rows expire 7 days after ``seen_at`` (the app's migration),
    whatever the window: a longer one is a warning naming the policy and how to lengthen it;
    where no policy expires them (the pullers prune to the window) any window is fine."""
    from spanner_queues.contrib.pubsub.conf import check_dedup_window
    from spanner_queues.drivers import driver_for
    from spanner_queues.engines import engine_for

    driver = type(driver_for(engine_for(BillingInbox).database))
    monkeypatch.setattr(driver, "supports_row_deletion_policy", True)
    settings.SPANNER_QUEUES_PUBSUB = {"DEDUP_WINDOW_DAYS": 7}
    assert check_dedup_window() == []
    settings.SPANNER_QUEUES_PUBSUB = {"DEDUP_WINDOW_DAYS": 30}
    warnings = check_dedup_window()  # one per inbox queue on Spanner (the drill's too)
    assert {w.id for w in warnings} == {"spanner_queues.W301"}
    [warning] = [w for w in warnings if w.obj is BillingInbox]
    assert warning.id == "spanner_queues.W301" and warning.obj is BillingInbox
    assert "30" in warning.msg and "7 days" in warning.msg
    assert "REPLACE ROW DELETION POLICY (OLDER_THAN(seen_at, INTERVAL 30 DAY))" in warning.hint
    monkeypatch.setattr(driver, "supports_row_deletion_policy", False)
    assert check_dedup_window() == []


def test_an_archive_longer_than_spanners_row_deletion_policy_is_w302(
    settings: Any, monkeypatch: Any
) -> None:
    """On Spanner the RelayedEvent rows expire 7 days after ``published_at`` (migration 0002):
    a longer archive there is a warning naming the policy and how to lengthen it."""
    from spanner_queues.contrib.pubsub.conf import check_archive_window
    from spanner_queues.drivers import driver_for
    from spanner_queues.engines import engine_for

    driver = type(driver_for(engine_for(OrderEvents).database))
    monkeypatch.setattr(driver, "supports_row_deletion_policy", True)
    settings.SPANNER_QUEUES_PUBSUB = {"ARCHIVE_DAYS": 7}
    assert check_archive_window() == []
    settings.SPANNER_QUEUES_PUBSUB = {"ARCHIVE_DAYS": 30}
    warnings = check_archive_window()  # one per relayed queue on Spanner (the drill's too)
    assert {w.id for w in warnings} == {"spanner_queues.W302"}
    [warning] = [w for w in warnings if w.obj is OrderEvents]
    assert "30" in warning.msg and "7 days" in warning.msg
    assert "(OLDER_THAN(published_at, INTERVAL 30 DAY))" in warning.hint
    monkeypatch.setattr(driver, "supports_row_deletion_policy", False)
    assert check_archive_window() == []

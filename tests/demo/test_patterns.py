"""Each of the thirteen Spanner-queue patterns, end to end in demo_project, with the worker in
burst mode (or in a thread where a pattern needs time to pass). Numbers follow
``docs/howto/patterns/`` and the spec's ``scenarios.md``."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from demo_project.accounts.models import UserTasks
from demo_project.accounts.services import REMINDER_BEFORE, sign_up, update_profile
from demo_project.analytics.models import HourlySales, Schedules
from demo_project.images.models import ImageTasks, ImageUpload
from demo_project.images.pixels import make_ppm, parse_ppm
from demo_project.images.services import upload_image
from demo_project.notifications import services as notifications
from demo_project.notifications.models import Digest, Notifications
from demo_project.ops.heartbeat import TIMEOUT, Heartbeat, send_beat
from demo_project.ops.models import WorkerAlert, WorkerHeartbeats
from demo_project.reports.models import Report, ReportJobs
from demo_project.reports.receivers import AUDIT_SLICE, run_ledger_audit
from demo_project.reports.services import request_report
from demo_project.search.models import ReindexQueue, SearchEntry
from demo_project.shop import receivers as shop_receivers
from demo_project.shop.carrier import carrier
from demo_project.shop.models import Order, OrderChecks, OrderTasks, Payment, Product
from demo_project.shop.services import place_order, restock
from spanner_queues import api
from spanner_queues.exceptions import MessageAlreadyAcked
from spanner_queues.options import queue_options
from spanner_queues.receivers import receivers
from tests.conftest import wait_until
from tests.demo.conftest import running

pytestmark = pytest.mark.django_db(transaction=True)
Drain = Callable[..., Any]


def _product(stock: int = 10) -> Product:
    return Product.objects.create(sku=f"SKU-{stock}", name="Mug", price_cents=1200, stock=stock)


def _customer() -> User:
    return sign_up("ada", "ada@example.com")


# --- 1. work after commit (outbox) -----------------------------------------------------------
def test_01_welcome_email_is_sent_only_for_committed_sign_ups(drain: Drain) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        sign_up("ghost", "ghost@example.com")
        raise RuntimeError("payment declined")  # the sign-up rolls back: no user, no message
    assert not User.objects.exists() and not UserTasks.objects.exists()

    user = sign_up("ada", "ada@example.com")
    assert UserTasks.objects.filter(user_id=user.pk, message_id="welcome").exists()
    drain(UserTasks)
    assert [m.subject for m in mail.outbox] == ["Welcome to the demo shop"]
    assert mail.outbox[0].to == ["ada@example.com"]
    assert not UserTasks.objects.filter(message_id="welcome").exists()


# --- 4. scheduled work -----------------------------------------------------------------------
def test_04_trial_reminder_is_not_delivered_early(drain: Drain) -> None:
    user = sign_up("ada", "ada@example.com")  # 30-day trial: reminder due in 29 days
    reminder = UserTasks.objects.get(user_id=user.pk, message_id="trial-reminder")
    assert reminder.deliver_time > timezone.now() + timedelta(days=28, hours=23)
    drain(UserTasks)
    assert [m.subject for m in mail.outbox] == ["Welcome to the demo shop"]
    assert UserTasks.objects.filter(message_id="trial-reminder").exists()

    # A trial that ends within REMINDER_BEFORE has its reminder due now.
    sign_up("bob", "bob@example.com", trial=REMINDER_BEFORE)
    drain(UserTasks)
    reminders = [m for m in mail.outbox if m.subject == "Your trial ends soon"]
    assert [m.to for m in reminders] == [["bob@example.com"]]


# --- 5. large payloads: data out of band, queue interleaved in its table ---------------------
def test_05_image_processing_reads_the_upload_row(drain: Drain) -> None:
    field = ImageTasks._meta.get_field("upload")
    assert queue_options(ImageTasks).interleave_in_parent == "upload"
    assert field.column == ImageUpload._meta.pk.column and not field.db_constraint
    user = _customer()
    upload = upload_image(user.pk, "cat.ppm", make_ppm(120, 80, seed=1))
    task = ImageTasks.objects.get().as_message()
    assert task.key_dict == {"upload_id": upload.pk, "message_id": "thumbnail"}
    assert task.payload == b""  # the message carries the key only
    drain(ImageTasks)
    upload.refresh_from_db()
    assert (upload.width, upload.height) == (120, 80) and upload.processed_at
    width, height, _ = parse_ppm(bytes(upload.thumbnail))
    assert max(width, height) <= 32
    assert not ImageTasks.objects.exists()

    # Deleting an upload deletes its pending tasks (ON DELETE CASCADE / the ForeignKey).
    other = upload_image(user.pk, "dog.ppm", make_ppm(10, 10, seed=2))
    other.delete()
    assert not ImageTasks.objects.exists()


# --- 6. waiting for several events (join) ----------------------------------------------------
def test_06_order_ships_only_when_inventory_and_payment_are_both_confirmed(drain: Drain) -> None:
    customer = _customer()
    order = place_order(customer.pk, _product(stock=10), quantity=2)
    drain(OrderTasks, OrderChecks)
    order.refresh_from_db()
    assert order.inventory_reserved_at and order.paid_at and order.shipped_at
    assert order.tracking_number
    assert Product.objects.get().stock == 8
    assert not OrderTasks.objects.exists()
    # A check that arrived before the other half re-queued itself (the watchdog); when it
    # comes back it finds the order under way and is acked without effect.
    assert all(c.deliver_time > timezone.now() for c in OrderChecks.objects.all())
    for check in OrderChecks.objects.all():
        OrderChecks.replace(**check.as_message().key_dict)
    drain(OrderChecks)
    assert not OrderChecks.objects.exists() and not OrderTasks.objects.exists()


def test_06_join_requeues_while_the_other_half_is_missing(drain: Drain) -> None:
    customer = _customer()
    product = _product(stock=0)
    order = place_order(customer.pk, product)
    drain(OrderTasks, OrderChecks)
    order.refresh_from_db()
    assert order.paid_at and not order.inventory_reserved_at and not order.fulfilment_started_at
    # Out of stock: the reservation was retried later; the payment's check re-queued itself.
    check = OrderChecks.objects.get(order_id=order.pk, event="payment_captured")
    assert check.deliver_time > timezone.now()
    assert OrderTasks.objects.get(order_id=order.pk, kind="reserve_inventory").deliver_time > (
        timezone.now()
    )
    # Restock, and deliver both now (as the admin's "deliver now" does): the order ships.
    restock(product, 5)
    OrderTasks.replace(order_id=order.pk, kind="reserve_inventory")
    OrderChecks.replace(order_id=order.pk, event="payment_captured")
    drain(OrderTasks, OrderChecks)
    order.refresh_from_db()
    assert order.shipped_at and order.tracking_number


# --- 7. periodic work ------------------------------------------------------------------------
def test_07_hourly_aggregation_runs_and_schedules_its_next_run(drain: Drain) -> None:
    customer = _customer()
    place_order(customer.pk, _product(), quantity=3)
    before = timezone.now()
    drain(Schedules)  # the worker seeds each schedule's first run, due now
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    row = HourlySales.objects.get(hour=hour)
    assert (row.orders, row.revenue_cents, row.signups) == (1, 3600, 1)
    nxt = Schedules.objects.get(name="hourly-sales")
    assert nxt.deliver_time >= before + timedelta(minutes=59)
    drain(Schedules)  # nothing due: no second run
    assert HourlySales.objects.get(hour=hour).computed_at == row.computed_at
    # the cron schedule is seeded for its next run: 03:00 in Paris, whatever the season
    nightly = Schedules.objects.get(name="nightly-sales").deliver_time.astimezone(
        ZoneInfo("Europe/Paris")
    )
    assert (nightly.hour, nightly.minute) == (3, 0)
    assert before < nightly <= before + timedelta(days=1)


# --- 8. temporal batching --------------------------------------------------------------------
def test_08_notifications_of_one_window_arrive_together_as_one_digest(
    drain: Drain, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(notifications, "WINDOW", timedelta(seconds=1))
    ada, bob = _customer(), sign_up("bob", "bob@example.com")
    drain(UserTasks)
    mail.outbox.clear()
    now = timezone.now()
    sent = [notifications.notify(ada.pk, f"ada {i}", now=now) for i in range(3)]
    sent += [notifications.notify(bob.pk, f"bob {i}", now=now) for i in range(2)]
    assert len({m.deliver_time for m in sent[:3]}) == 1  # one instant per user and window
    wait_until(lambda: timezone.now() >= max(m.deliver_time for m in sent))
    drain(Notifications)
    assert sorted(Digest.objects.values_list("user__username", "items")) == [("ada", 3), ("bob", 2)]
    assert sorted(len(m.body.splitlines()) for m in mail.outbox) == [2, 3]
    assert not Notifications.objects.exists()


# --- 9. dirty flag ---------------------------------------------------------------------------
def test_09_profile_edits_leave_one_dirty_flag_and_are_reindexed_in_a_batch(
    drain: Drain, events: Any
) -> None:
    ada, bob = _customer(), sign_up("bob", "bob@example.com")
    for bio in ("likes queues", "collects mugs", "acks promptly"):
        update_profile(ada.pk, bio=bio)
    update_profile(bob.pk, display_name="Bobby")
    assert sorted(ReindexQueue.objects.values_list("user_id", flat=True)) == [ada.pk, bob.pk]
    drain(ReindexQueue)
    assert "acks promptly" in SearchEntry.objects.get(user_id=ada.pk).text
    assert "Bobby" in SearchEntry.objects.get(user_id=bob.pk).text
    acked = [e for e in events.history if e.name == "acked"]
    assert len(acked) == 2 and len({e.duration for e in acked}) == 1  # one batch
    assert not ReindexQueue.objects.exists()


# --- 10. worker heartbeats and timeout alerts ------------------------------------------------
def test_10_heartbeat_is_replaced_and_deleted_on_a_clean_stop() -> None:
    with Heartbeat("worker-a"):
        first = WorkerHeartbeats.objects.get(worker_id="worker-a")
        assert first.deliver_time > timezone.now() + TIMEOUT - timedelta(seconds=5)
        send_beat("worker-a")  # delete + insert under the same key
        assert WorkerHeartbeats.objects.count() == 1
    assert not WorkerHeartbeats.objects.exists()  # clean shutdown: no alert


def test_10_a_delivered_heartbeat_raises_an_alert(drain: Drain) -> None:
    send_beat("worker-dead", timeout=timedelta(0), pid=1234)  # it beats no more
    drain(WorkerHeartbeats)
    alert = WorkerAlert.objects.get()
    assert alert.worker_id == "worker-dead" and json.loads(alert.info) == {"pid": 1234}
    assert mail.outbox[0].subject == "Worker worker-dead stopped"


def test_10_runqueueworker_beats_while_it_runs_and_cleans_up() -> None:
    send_beat("worker-dead", timeout=timedelta(0))
    call_command("runqueueworker", "ops.WorkerHeartbeats", burst=True, worker_id="w1", verbosity=0)
    assert WorkerAlert.objects.filter(worker_id="worker-dead").exists()
    assert not WorkerHeartbeats.objects.exists()  # w1's own heartbeat went with it


# --- 11. polymorphic queue -------------------------------------------------------------------
def test_11_order_tasks_dispatch_on_their_kind(drain: Drain, events: Any) -> None:
    specs = receivers.for_queue(OrderTasks)
    assert {s.match["kind"]: s.func for s in specs} == {
        "reserve_inventory": shop_receivers.reserve_inventory,
        "capture_payment": shop_receivers.capture_payment,
        "book_shipment": shop_receivers.book_shipment,
    }
    order = place_order(_customer().pk, _product())
    drain(OrderTasks)
    by_kind = {e.message.key_dict["kind"]: e.receiver for e in events.history if e.name == "acked"}
    assert by_kind == {
        "reserve_inventory": "demo_project.shop.receivers.reserve_inventory",
        "capture_payment": "demo_project.shop.receivers.capture_payment",
    }
    order.refresh_from_db()
    assert order.inventory_reserved_at and order.paid_at


# --- 12. custom retry delay ------------------------------------------------------------------
def test_12_rate_limited_carrier_call_is_retried_after_retry_after(
    worker: Callable[..., Any], events: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(carrier, "max_calls", 0)  # every call answers 429...
    monkeypatch.setattr(carrier, "retry_after", timedelta(seconds=0.5))  # ...Retry-After: 0.5
    order = place_order(_customer().pk, _product())
    Order.objects.filter(pk=order.pk).update(fulfilment_started_at=timezone.now())
    OrderTasks.objects.filter(order_id=order.pk).delete()
    OrderTasks.send(order_id=order.pk, kind="book_shipment")
    with running(worker(OrderTasks)):
        assert events.wait_for("retried")
        retried = OrderTasks.objects.get(order_id=order.pk, kind="book_shipment")
        assert retried.deliver_time > retried.send_time + timedelta(seconds=0.4)
        monkeypatch.setattr(carrier, "max_calls", 10)  # the carrier accepts calls again
        assert events.wait_for("acked")
    order.refresh_from_db()
    assert order.shipped_at and order.tracking_number
    assert Order.objects.get(pk=order.pk).tracking_number == order.tracking_number


# --- 2. long-running work: lease renewal -----------------------------------------------------
def test_02_long_report_outlives_its_lease_and_is_delivered_once(drain: Drain, events: Any) -> None:
    report = request_report("sales_export", rows=100)  # 100 rows x 0.02 s, lease 0.6 s
    drain(ReportJobs, lease=timedelta(seconds=0.6))
    report.refresh_from_db()
    assert report.status == "done" and report.rows_done == 100
    assert report.deliveries == 1  # never redelivered: the worker kept renewing the lease
    assert events.counts["renewed"] >= 1 and events.counts["acked"] == 1
    assert not ReportJobs.objects.exists()


def test_02_long_report_gives_its_message_back_when_the_worker_stops(
    worker: Callable[..., Any], events: Any
) -> None:
    # A Ctrl-C of bin/demo waited for an export in flight (300 rows x 0.05 s, and its progress
    # writes: 20 s on the emulator front): it ends at its next row and runs again later.
    report = request_report("sales_export", rows=100_000)  # ~80 minutes if run to the end
    w = worker(ReportJobs)
    with running(w):
        wait_until(lambda: Report.objects.get(pk=report.pk).rows_done >= 20, timeout=60)
    report.refresh_from_db()
    assert report.status == "queued" and report.rows_done == 0, report.status
    assert events.counts["retried"] == 1 and events.counts["acked"] == 0
    assert ReportJobs.objects.filter(report_id=report.pk).exists()  # delivered again later


# --- 3. checkpointing ------------------------------------------------------------------------
def test_03_ledger_audit_checkpoints_and_resumes_after_a_crash(drain: Drain) -> None:
    customer = _customer()
    order = place_order(customer.pk, _product())
    Payment.objects.bulk_create(
        [Payment(order=order, amount_cents=100 + i, reference="x") for i in range(60)]
    )
    report = request_report("ledger_audit")
    # One slice by hand, as a worker that then crashes: state saved, next message sent.
    (message,) = api.receive(ReportJobs)
    with transaction.atomic():
        run_ledger_audit(message)
    report.refresh_from_db()
    assert report.state["payments"] == AUDIT_SLICE and report.checkpoints == 1
    assert ReportJobs.objects.get().as_message().json()["after_id"] == report.state["after_id"]
    drain(ReportJobs)  # another worker resumes from the checkpoint
    report.refresh_from_db()
    assert report.status == "done" and report.state["payments"] == 60
    assert report.state["total_cents"] == sum(100 + i for i in range(60))
    assert report.checkpoints == 2 and report.deliveries == 3
    assert not ReportJobs.objects.exists()


# --- 13. exactly-once processing -------------------------------------------------------------
def test_13_a_late_duplicate_delivery_rolls_back_its_payment(drain: Drain) -> None:
    order = place_order(_customer().pk, _product())
    OrderTasks.objects.filter(kind="reserve_inventory").delete()
    Order.objects.filter(pk=order.pk).update(inventory_reserved_at=timezone.now())
    (slow,) = api.receive(OrderTasks)  # a worker leases it, then stalls past its lease...
    # ...meanwhile another delivery captures the payment and acks, in one transaction.
    with transaction.atomic():
        shop_receivers.capture_payment(slow)
        api.ack(slow)
    drain(OrderChecks)
    assert Payment.objects.count() == 1
    # The stalled worker wakes up and does the same: its ack finds no row, so its whole
    # transaction (ledger row included) rolls back.
    with pytest.raises(MessageAlreadyAcked), transaction.atomic():
        shop_receivers.capture_payment(slow)
        api.ack(slow)
    assert Payment.objects.count() == 1
    assert Order.objects.get(pk=order.pk).paid_at
    assert not OrderChecks.objects.exists()

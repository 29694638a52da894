"""Two ways to run long work (patterns 2 and 3).

- ``build_sales_export`` runs longer than a lease in one go. The worker renews its lease in the
  background (every half lease) while it runs. It is not atomic: on SQLite an open transaction
  holds the database's write lock, and on Spanner a transaction should stay short.
- ``run_ledger_audit`` works in slices. Each slice saves its state in the ``Report`` row and,
  in the same transaction, acks its message and sends the next one (``checkpoint``). A crash
  loses at most one slice: the current message is delivered again after its lease and resumes
  from the last state.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Sum
from django.utils import timezone

from demo_project.reports.models import Report, ReportJobs
from demo_project.shop.models import Order, Payment
from spanner_queues import Retry, receiver
from spanner_queues.message import Message
from spanner_queues.patterns import checkpoint
from spanner_queues.receivers import MessageContext

#: rows per ledger-audit slice; the next slice is due at once (raise it to yield to others)
AUDIT_SLICE = 25
AUDIT_PAUSE = timedelta(0)


def row_seconds() -> float:
    """Simulated cost of rendering one row of the sales export."""
    return float(getattr(settings, "DEMO_REPORT_ROW_SECONDS", 0.05))


@receiver(ReportJobs, match={"kind": "sales_export"}, atomic=False, takes_context=True)
def build_sales_export(context: MessageContext, message: Message) -> None:
    """Pattern 2 (long-running work, lease renewal)."""
    report_id = message.key_dict["report_id"]
    Report.objects.filter(pk=report_id).update(
        status="running", rows_done=0, deliveries=F("deliveries") + 1
    )
    report = Report.objects.get(pk=report_id)
    for row in range(1, report.rows_total + 1):
        if context.should_stop():  # Ctrl-C, SIGTERM: run it again later, do not hold the stop
            Report.objects.filter(pk=report_id).update(status="queued", rows_done=0)
            raise Retry(reason="the worker is stopping")
        time.sleep(row_seconds())  # render one row
        if row % 20 == 0 or row == report.rows_total:
            Report.objects.filter(pk=report_id).update(rows_done=row)
    totals = Order.objects.aggregate(orders=Count("id"), revenue=Sum("amount_cents"))
    with transaction.atomic():
        Report.objects.filter(pk=report_id).update(
            status="done",
            state_json=json.dumps(
                {"orders": totals["orders"], "revenue_cents": totals["revenue"] or 0}
            ),
            finished_at=timezone.now(),
        )
    # returning acks the message (the worker's own transaction)


@receiver(ReportJobs, match={"kind": "ledger_audit"})
def run_ledger_audit(message: Message) -> None:
    """Pattern 3 (checkpointing): one slice of the ledger per delivery."""
    report = Report.objects.select_for_update().get(pk=message.key_dict["report_id"])
    state = report.state or {"after_id": 0, "payments": 0, "total_cents": 0}
    payments = list(Payment.objects.filter(pk__gt=state["after_id"]).order_by("pk")[:AUDIT_SLICE])
    state = {
        "after_id": payments[-1].pk if payments else state["after_id"],
        "payments": state["payments"] + len(payments),
        "total_cents": state["total_cents"] + sum(p.amount_cents for p in payments),
    }
    report.state = state
    report.rows_done = state["payments"]
    report.deliveries += 1
    if len(payments) < AUDIT_SLICE:  # the end of the ledger: done, the worker acks
        report.status = "done"
        report.rows_total = state["payments"]
        report.finished_at = timezone.now()
        report.save()
        return
    report.status = "running"
    report.checkpoints += 1
    report.save()
    # Ack this message and send the next (same key), in this transaction: the state above and
    # the pointer to it commit together.
    checkpoint(message, {"kind": "ledger_audit", "after_id": state["after_id"]}, after=AUDIT_PAUSE)

"""Requesting reports."""

from __future__ import annotations

from django.db import transaction

from demo_project.reports.models import Report, ReportJobs


def request_report(kind: str, *, rows: int = 0) -> Report:
    """Create the report and its job in one transaction."""
    with transaction.atomic():
        report = Report.objects.create(kind=kind, rows_total=rows)
        ReportJobs.send(report_id=report.pk, payload={"kind": kind})
    return report

from __future__ import annotations

from django.contrib import admin

from demo_project.reports.models import Report


@admin.register(Report)
class ReportAdmin(admin.ModelAdmin):
    list_display = (
        "__str__",
        "status",
        "rows_done",
        "rows_total",
        "deliveries",
        "checkpoints",
        "finished_at",
    )

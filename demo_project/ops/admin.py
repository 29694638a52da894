from __future__ import annotations

from django.contrib import admin

from demo_project.ops.models import WorkerAlert


@admin.register(WorkerAlert)
class WorkerAlertAdmin(admin.ModelAdmin):
    list_display = ("worker_id", "last_beat_at", "detected_at")

from __future__ import annotations

from django.contrib import admin

from demo_project.ops.models import WorkerAlert


@admin.register(WorkerAlert)
class WorkerAlertAdmin(admin.ModelAdmin):
    list_display = ("worker_id", "simulated", "last_beat_at", "detected_at")

    @admin.display(boolean=True, description="simulated by the demo")
    def simulated(self, alert: WorkerAlert) -> bool:
        return alert.simulated

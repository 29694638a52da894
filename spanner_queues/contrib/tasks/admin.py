"""The task results in the admin: read-only, filtered by status, backend, queue and task."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from spanner_queues.contrib.tasks.models import TaskResultRecord


class TaskResultAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "task_path",
        "status",
        "queue_name",
        "attempts",
        "enqueued_at",
        "finished_at",
    )
    list_filter = ("status", "backend", "queue_name", "task_path")
    search_fields = ("id", "task_path")
    date_hierarchy = "enqueued_at"
    ordering = ("-enqueued_at",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


admin.site.register(TaskResultRecord, TaskResultAdmin)

"""The task results in the admin: read-only, filtered by status, backend, queue and task."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

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
    exclude = ("errors_json",)  # shown by ``errors``

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # the errors as their tracebacks read, not as the JSON that stores them
        return ["errors" if f.name == "errors_json" else f.name for f in self.model._meta.fields]

    @admin.display(description="errors")
    def errors(self, obj: TaskResultRecord) -> SafeString:
        """Each error's exception class, then its traceback, preformatted (escaped)."""
        if not obj.errors:
            return format_html("{}", "-")
        return format_html_join(
            "",
            "<pre>{}\n{}</pre>",
            (
                (error.get("exception_class_path", ""), error.get("traceback", ""))
                for error in obj.errors
            ),
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


admin.site.register(TaskResultRecord, TaskResultAdmin)

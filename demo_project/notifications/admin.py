from __future__ import annotations

from django.contrib import admin

from demo_project.notifications.models import Digest


@admin.register(Digest)
class DigestAdmin(admin.ModelAdmin):
    list_display = ("user", "items", "sent_at")

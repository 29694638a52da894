from __future__ import annotations

from django.contrib import admin

from demo_project.shipping.models import PackingSlip


@admin.register(PackingSlip)
class PackingSlipAdmin(admin.ModelAdmin):
    list_display = ("order_id", "event_id", "prepared_at")

from __future__ import annotations

from django.contrib import admin

from demo_project.analytics.models import HourlySales


@admin.register(HourlySales)
class HourlySalesAdmin(admin.ModelAdmin):
    list_display = ("hour", "orders", "revenue_cents", "signups", "computed_at")

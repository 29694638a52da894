from __future__ import annotations

from django.contrib import admin

from demo_project.accounts.models import Profile


@admin.register(Profile)
class ProfileAdmin(admin.ModelAdmin):
    list_display = ("user", "display_name", "plan", "trial_ends_at")
    search_fields = ("user__username", "display_name")

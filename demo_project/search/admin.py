from __future__ import annotations

from django.contrib import admin

from demo_project.search.models import SearchEntry


@admin.register(SearchEntry)
class SearchEntryAdmin(admin.ModelAdmin):
    list_display = ("user_id", "text", "indexed_at")
    search_fields = ("text",)

"""The search index, kept fresh by dirty-flag messages."""

from __future__ import annotations

from django.apps import AppConfig


class SearchConfig(AppConfig):
    name = "demo_project.search"
    label = "search"

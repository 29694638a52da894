from __future__ import annotations

from typing import Any

from asgiref.local import Local
from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import autodiscover_modules

from spanner_queues import (
    checks,  # registers the system checks; the app raises E014 at start
    introspection,
)
from spanner_queues.engines import engines


def _reset_engines(*, setting: str, **kwargs: Any) -> None:
    if setting in ("SPANNER_QUEUES", "DATABASES"):
        engines.__dict__.pop("settings", None)
        engines._settings = None
        engines._connections = Local(engines.thread_critical)


class SpannerQueuesConfig(AppConfig):
    name = "spanner_queues"
    verbose_name = "Spanner queues"
    default_auto_field = "django.db.models.AutoField"

    def __init__(self, app_name: str, app_module: Any) -> None:
        # Before any model is built: a database on Spanner without the driver would otherwise
        # stop Django (building models on the default database, or in its own model checks)
        # with "'django_spanner' isn't an available database backend", before check E014.
        super().__init__(app_name, app_module)
        unloadable = checks.unloadable_spanner_databases()
        if unloadable:
            raise ImproperlyConfigured(f"{unloadable} (spanner_queues.E014)")

    def ready(self) -> None:
        setting_changed.connect(_reset_engines, dispatch_uid="spanner_queues.reset_engines")
        introspection.connect()  # native queues are not tables to flush or inspectdb
        autodiscover_modules("receivers")  # @receiver declarations, like admin.py

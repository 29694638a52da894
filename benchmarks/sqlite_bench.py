"""Set-up shared by the benchmarks that compare spanner_queues with django-tasks-db on one fresh
SQLite file (``worker_vs_django_tasks_db.py``, ``tasks_vs_django_tasks_db.py``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup(workdir: Path, settings_module: str) -> None:
    """Configure Django with ``settings_module`` on ``workdir/bench.sqlite3`` and migrate."""
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    os.environ["SQ_BENCH_SQLITE_PATH"] = str(workdir / "bench.sqlite3")
    os.environ.pop("SQ_BENCH_TRACE", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)


def clear(*model_paths: str) -> None:
    """Delete every row of the models named ``app_label.ModelName``, and of django-tasks-db's
    results (the peer's queue)."""
    from django.apps import apps

    for path in (*model_paths, "django_tasks_database.DBTaskResult"):
        apps.get_model(path).objects.all().delete()

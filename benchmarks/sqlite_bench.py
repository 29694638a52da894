"""Set-up shared by the benchmarks that compare spanner_queues with django-tasks-db on one fresh
SQLite file (``worker_vs_django_tasks_db.py``, ``tasks_vs_django_tasks_db.py``)."""

from __future__ import annotations

import compileall
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup(workdir: Path, settings_module: str) -> None:
    """Configure Django with ``settings_module`` on ``workdir/bench.sqlite3`` and migrate;
    with ``$SQ_BENCH_BACKEND=postgres``, on a fresh database of a private PostgreSQL server
    instead (``postgres_database``)."""
    sys.path.insert(0, str(ROOT))
    # the checkout's bytecode, as an installed wheel has its own (pip compiles it): without
    # it, with PYTHONDONTWRITEBYTECODE set, each worker process started compiled every module
    # of the package again (0.45 s), while the peer's, installed from a wheel, had theirs
    for package in ("spanner_queues", "benchmarks"):
        compileall.compile_dir(ROOT / package, quiet=1)
    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    os.environ["SQ_BENCH_SQLITE_PATH"] = str(workdir / "bench.sqlite3")
    os.environ.pop("SQ_BENCH_TRACE", None)
    if os.environ.get("SQ_BENCH_BACKEND") == "postgres":
        os.environ["SQ_BENCH_POSTGRES"] = postgres_database()
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


def postgres_database() -> str:
    """``host:port/name`` of a new database on a private PostgreSQL server (the test suite's
    ``tests.postgres_server``, stopped at exit), made durable for the run: the suite's server
    runs with ``fsync=off`` and ``synchronous_commit=off``, and a commit here waits for its WAL
    flush, as a production server's does."""
    import psycopg

    from tests.postgres_server import SUPERUSER, ensure_postgres

    host, port = ensure_postgres()
    name = f"sqbench{os.getpid()}"
    with psycopg.connect(host=host, port=port, user=SUPERUSER, dbname="postgres") as conn:
        conn.autocommit = True
        conn.execute(f"CREATE DATABASE {name}")
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {setting} = on")
        conn.execute("SELECT pg_reload_conf()")
    return f"{host}:{port}/{name}"

"""docs/howto/cloud-spanner.md runs as written: its settings snippet, what it says
django-google-spanner reads, the grants it shows for the demo's queues (regenerated), and its
probe configuration (the one in deploy/)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import environ
import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "howto" / "cloud-spanner.md"
pytestmark = pytest.mark.engine_independent  # the page, settings and printed text; no database


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", PAGE.read_text(), re.M | re.S)


def _settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict[str, Any]:
    for name in ("GOOGLE_CLOUD_PROJECT", "SPANNER_DATABASE_ROLE", "SPANNER_QUEUES_ENGINE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    [snippet] = [b for b in _blocks("python") if "DATABASES" in b]
    namespace: dict[str, Any] = {}
    exec(compile(snippet, str(PAGE), "exec"), namespace)
    return namespace


def test_the_settings_snippet_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    ns = _settings(
        monkeypatch,
        GOOGLE_CLOUD_PROJECT="p",
        SPANNER_INSTANCE="i",
        SPANNER_DATABASE="d",
        SPANNER_DATABASE_ROLE="worker",
    )
    db = ns["DATABASES"]["default"]
    assert (db["ENGINE"], db["INSTANCE"], db["NAME"]) == ("django_spanner", "i", "d")
    assert db["OPTIONS"] == {"database_role": "worker"}
    assert ns["INSTALLED_APPS"][0] == "django_spanner"
    assert ns["SPANNER_QUEUES"]["default"]["ENGINE"] == "native"
    ns = _settings(
        monkeypatch, GOOGLE_CLOUD_PROJECT="p", SPANNER_INSTANCE="i", SPANNER_DATABASE="d"
    )
    assert ns["DATABASES"]["default"]["OPTIONS"] == {"database_role": None}


def test_the_settings_snippet_requires_the_project(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(environ.ImproperlyConfigured, match="GOOGLE_CLOUD_PROJECT"):
        _settings(monkeypatch, SPANNER_INSTANCE="i", SPANNER_DATABASE="d")


def test_django_spanner_takes_the_project_from_the_environment_and_options_to_connect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the page says django-google-spanner 5.2 reads (no connection is made)."""
    from django.db.utils import ConnectionHandler

    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "from-env")
    handler = ConnectionHandler(
        {
            "default": {"ENGINE": "django.db.backends.dummy"},
            "sp": {
                "ENGINE": "django_spanner",
                "PROJECT": "from-settings",
                "INSTANCE": "i",
                "NAME": "d",
                "OPTIONS": {"database_role": "worker"},
            },
        }
    )
    params = handler["sp"].get_connection_params()
    assert params["project"] == "from-env"  # the PROJECT key is not read
    assert params["database_role"] == "worker"  # OPTIONS go to spanner_dbapi.connect()
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT")
    assert handler["sp"].get_connection_params()["project"] == "test-project"


def _demo_grants(tmp_path: Path, *args: str) -> str:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "demo_project.settings",
        "DEMO_DATABASE": "spanner",
        "SPANNER_QUEUES_ENGINE": "native",
        "DEMO_VAR_DIR": str(tmp_path),
        "DEMO_PUBSUB": "0",  # the shop alone, as the page says
    }
    env.pop("SPANNER_EMULATOR_HOST", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "queuegrants",
            "--role-sender",
            "web",
            "--role-worker",
            "worker",
            *args,
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_grants_shown_for_the_demo_are_what_the_command_prints(tmp_path: Path) -> None:
    shown = {}
    for block in _blocks("console"):
        command, _, output = block.partition("\n")
        if "queuegrants" in command:
            shown[command.split("--role-worker worker", 1)[1].strip()] = output
    assert set(shown) == {"", "--dialect postgresql --queue shop.OrderTasks"}
    assert shown[""] == _demo_grants(tmp_path)
    pg = "--dialect postgresql --queue shop.OrderTasks"
    assert shown[pg] == _demo_grants(tmp_path, *pg.split())


def test_the_probe_configuration_is_the_worker_deployments() -> None:
    [snippet] = [b for b in _blocks("yaml") if "livenessProbe" in b]
    shown = yaml.safe_load(snippet)
    text = (ROOT / "deploy" / "kubernetes" / "worker.yaml").read_text()
    [deployment] = [d for d in yaml.safe_load_all(text) if d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    for key, value in shown.items():
        assert container[key] == value, key

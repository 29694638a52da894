"""Without ``spanner_queues.contrib.tracing`` in ``INSTALLED_APPS`` nothing of OpenTelemetry is
imported and no instrumentation is installed (a fresh process with the test settings)."""

from __future__ import annotations

import subprocess
import sys

from tests.children import ROOT

PROBE = """
import sys
import django
django.setup()
from django.conf import settings
import spanner_queues.api, spanner_queues.worker, spanner_queues.outbox
from spanner_queues import instrumentation
assert "spanner_queues.contrib.tracing" not in settings.INSTALLED_APPS
print(instrumentation.installed, sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""


def test_without_the_app_opentelemetry_is_never_imported() -> None:
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None []"

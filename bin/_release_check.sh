#!/usr/bin/env bash
# The release artifact, as a user gets it: build the sdist and the wheel with the standard
# frontend (`python -m build`; the wheel is built from the sdist) into the README's wheelhouse
# (~/wheels, HOME being a temporary directory), fail on any deprecation warning of the build,
# install the wheel with the README's install line, run as written from a directory outside the
# checkout, into a fresh virtualenv (no Spanner driver comes with it), and run the quickstart
# (docs/quickstart.md) against it: startproject, a queue model, makemigrations (CreateQueue),
# migrate, a send in a transaction, `runqueueworker --burst`, the ack checked; the admin pages'
# templates and `collectstatic`. Then the same install line and quickstart in a Django 6.0
# project on Python 3.12 (bin/_find_python.sh; not found: skipped, saying so, or a failure
# in CI). The wheel carries no emulator front: that is its own distribution (emulator/,
# spanner-queues-emulator), built and installed into the first virtualenv afterwards, where
# `python -m spanner_queues_emulator --help` and its console script must run.
# Usage: bin/_release_check.sh   (PYTHON: the interpreter that builds; default: python)
# Needs PyPI (or a mirror pip is configured for) to install the wheel's dependencies.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/sq-release.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
fail() { echo "release check: $*" >&2; exit 1; }
# the user's home, where the README's wheelhouse ~/wheels is; pip keeps the caller's cache
USER_HOME="$WORK/home"
mkdir -p "$USER_HOME"
PIP_CACHE_DIR="$("$PY" -m pip cache dir 2>/dev/null || echo "$USER_HOME/.cache/pip")"
export PIP_CACHE_DIR

echo "-- build (sdist, then the wheel from it) into ~/wheels ($USER_HOME/wheels)"
# PYTHONWARNINGS=always: setuptools' deprecations are printed whatever the caller's filters
if ! PYTHONWARNINGS=always "$PY" -m build --outdir "$USER_HOME/wheels" "$ROOT" >"$WORK/build.log" 2>&1; then
  cat "$WORK/build.log" >&2
  fail "python -m build failed"
fi
if grep -i -n "deprecat" "$WORK/build.log" >&2; then
  fail "the build printed the deprecation warning(s) above"
fi
VERSION="$(cd "$ROOT" && "$PY" -c 'import ast, pathlib
tree = ast.parse(pathlib.Path("spanner_queues/__init__.py").read_text())
print(next(n.value.value for n in tree.body if isinstance(n, ast.Assign)
           and getattr(n.targets[0], "id", "") == "__version__"))')"
WHEEL="$USER_HOME/wheels/spanner_queues-$VERSION-py3-none-any.whl"
SDIST="$USER_HOME/wheels/spanner_queues-$VERSION.tar.gz"
[ -f "$WHEEL" ] || fail "no wheel $WHEEL (built: $(ls "$USER_HOME/wheels"))"
[ -f "$SDIST" ] || fail "no sdist $SDIST (built: $(ls "$USER_HOME/wheels"))"
"$PY" - "$WHEEL" "$VERSION" <<'EOF'
"""The wheel holds the package data a user needs, and says what it is."""
import sys
import zipfile

wheel, version = sys.argv[1], sys.argv[2]
names = set(zipfile.ZipFile(wheel).namelist())
info = f"spanner_queues-{version}.dist-info"
needed = [
    "spanner_queues/py.typed",
    "spanner_queues/templates/spanner_queues/admin/overview.html",
    "spanner_queues/migrations/0001_initial.py",
    "spanner_queues/contrib/tasks/migrations/0001_initial.py",
    "spanner_queues/contrib/metrics/exporter.py",
    "spanner_queues/management/commands/runqueueworker.py",
    "spanner_queues/management/commands/queuegrants.py",
    f"{info}/licenses/LICENSE",
]
missing = [n for n in needed if n not in names]
if missing:
    sys.exit(f"the wheel lacks {missing}")
if any(n.startswith(("tests/", "demo_project/", "benchmarks/")) for n in names):
    sys.exit("the wheel carries the repository's tests, demo or benchmarks")
if any(n.startswith(("spanner_queues/emulator/", "spanner_queues_emulator/")) for n in names):
    sys.exit("the app's wheel carries the emulator front (a distribution of its own)")
meta = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
for line in ("License-Expression: Apache-2.0", f"Version: {version}", "License-File: LICENSE"):
    if line not in meta.splitlines():
        sys.exit(f"METADATA lacks {line!r}")
print(f"wheel: {len(names)} files, Apache-2.0, version {version}")
EOF

# The README's first install line, run as written: ~/wheels is the wheelhouse built above
INSTALL="$(grep -m1 -E '^python -m pip install --find-links ~/wheels ' "$ROOT/README.md")" \
  || fail "README.md has no 'python -m pip install --find-links ~/wheels ...' line"
INSTALL="${INSTALL%%#*}"
unset PYTHONPATH DJANGO_SETTINGS_MODULE

install_line() {  # install_line VENV [REQUIREMENT...]: the README's line, from outside the checkout
  local venv="$1"
  shift
  mkdir -p "$WORK/elsewhere"
  (cd "$WORK/elsewhere" && HOME="$USER_HOME" PATH="$venv/bin:$PATH" \
    bash -c "$INSTALL --disable-pip-version-check --quiet $*") 2>&1 \
    | grep -v "^WARNING: Location" || true
  cd "$WORK/elsewhere"  # the checkout is not on the path
  "$venv/bin/python" - "$VERSION" <<'EOF'
import importlib.metadata
import importlib.util
import pathlib
import sys

import django

import spanner_queues

version = sys.argv[1]
assert spanner_queues.__version__ == version, spanner_queues.__version__
assert importlib.metadata.version("spanner-queues") == version
where = pathlib.Path(spanner_queues.__file__).resolve()
assert "site-packages" in where.parts, f"imported from {where}, not from the installed wheel"
import prometheus_client  # noqa: F401  (the [metrics] extra of the install line)
# the Spanner driver is the `spanner` extra, not in the line: not installed
for module in ("django_spanner", "google"):
    assert importlib.util.find_spec(module) is None, f"{module} came with the install line"
print(f"installed spanner-queues {version} at {where.parent} (Django {django.get_version()})")
EOF
}

echo "-- a fresh virtualenv, the README's install line, run from outside the checkout"
"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
install_line "$WORK/venv"
if "$VPY" -c "import spanner_queues_emulator" 2>/dev/null; then
  fail "the app's wheel installed the emulator front (spanner_queues_emulator)"
fi

echo "-- the emulator front's own distribution (emulator/): build, install, --help"
if ! PYTHONWARNINGS=always "$PY" -m build --outdir "$WORK/dist-emulator" "$ROOT/emulator" \
  >"$WORK/build-emulator.log" 2>&1; then
  cat "$WORK/build-emulator.log" >&2
  fail "python -m build emulator/ failed"
fi
if grep -i -n "deprecat" "$WORK/build-emulator.log" >&2; then
  fail "the emulator's build printed the deprecation warning(s) above"
fi
"$VPY" -m pip install --quiet --disable-pip-version-check "$WORK"/dist-emulator/spanner_queues_emulator-*.whl \
  2>&1 | grep -v "^WARNING: Location" || true
"$VPY" -m spanner_queues_emulator --help >"$WORK/emulator-help.txt" \
  || fail "python -m spanner_queues_emulator --help failed"
grep -q -- "--host-port" "$WORK/emulator-help.txt" || fail "the emulator's --help lacks --host-port"
"$WORK/venv/bin/spanner-queues-emulator" --help >/dev/null \
  || fail "the spanner-queues-emulator console script failed"

quickstart() {  # quickstart VENV DIR: docs/quickstart.md in DIR, with VENV's python
  (
set -euo pipefail
echo "-- the quickstart in $2"
mkdir -p "$2"
cd "$2"
export PATH="$1/bin:$PATH"
django-admin startproject mysite .
python manage.py startapp tasks
cat >>mysite/settings.py <<'EOF'

# docs/quickstart.md, step 3
INSTALLED_APPS += ["spanner_queues", "tasks"]
DATABASES["default"]["OPTIONS"] = {
    "init_command": "PRAGMA journal_mode=WAL;",
    "transaction_mode": "IMMEDIATE",
}
STATIC_ROOT = BASE_DIR / "static"
EOF
cat >tasks/models.py <<'EOF'
from django.db import models

from spanner_queues.models import Queue


class UserTasks(Queue):
    """Work to do for a user, keyed like Google's UserTasks example."""

    user_id = models.BigIntegerField()
    message_id = models.CharField(max_length=64)
    pk = models.CompositePrimaryKey("user_id", "message_id")
EOF
cat >tasks/receivers.py <<'EOF'
from django.contrib.auth.models import User

from spanner_queues import receiver

from tasks.models import UserTasks


@receiver(UserTasks)
def welcome(message):
    User.objects.filter(pk=message.key_dict["user_id"]).update(first_name="welcomed")
EOF
python manage.py check --fail-level WARNING
python manage.py makemigrations tasks | tee makemigrations.txt
grep -q "Create queue UserTasks" makemigrations.txt || fail "makemigrations wrote no CreateQueue"
python manage.py migrate -v0
python manage.py shell -c '
from django.contrib.auth.models import User
from django.db import transaction
from tasks.models import UserTasks
with transaction.atomic():
    user = User.objects.create(username="ada")
    sent = UserTasks.send(user_id=user.pk, message_id="welcome", payload={"type": "welcome"})
assert sent.payload == b"{\"type\":\"welcome\"}", sent.payload
assert UserTasks.objects.count() == 1
from django.db import connection
ours = [t for t in connection.introspection.table_names() if t.startswith("spanner_queues")]
assert not [t for t in ours if "task" in t], f"the Tasks app is not installed, yet: {ours}"
'
python manage.py runqueueworker --burst -v2 | tee worker.txt
grep -q "^acked" worker.txt || fail "runqueueworker --burst acked nothing"
python manage.py shell -c '
from django.contrib.auth.models import User
from tasks.models import UserTasks
assert UserTasks.objects.count() == 0, "the message was not acked"
assert User.objects.get(username="ada").first_name == "welcomed", "the receiver did not run"
'
python manage.py collectstatic --noinput -v0
[ -f static/admin/css/base.css ] || fail "collectstatic collected no admin static files"
python manage.py shell -c '
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
User.objects.create_superuser("admin", "admin@example.com", "pw")
client = Client()
client.force_login(User.objects.get(username="admin"))
response = client.get("/admin/spanner_queues/queues/")
assert response.status_code == 200, response.status_code
assert "tasks.UserTasks" in response.content.decode(), "the queue overview lacks the queue"
assert "spanner_queues/admin/overview.html" in [t.name for t in response.templates]
'
  )
}

quickstart "$WORK/venv" "$WORK/proj"

echo "-- a Django 6.0 project on Python 3.12: the same install line, the quickstart"
if PY312="$("$ROOT/bin/_find_python.sh" 3.12)"; then
  "$PY312" -m venv "$WORK/venv-django6"
  install_line "$WORK/venv-django6" "'django>=6.0,<6.1'"
  "$WORK/venv-django6/bin/python" -c 'import django; assert django.VERSION[:2] == (6, 0), django.VERSION'
  quickstart "$WORK/venv-django6" "$WORK/proj-django6"
elif [ -n "${CI:-}" ]; then
  fail "no Python 3.12 for the Django 6.0 project: CI must run it"
else
  echo "SKIPPED: the Django 6.0 project (no Python 3.12)"
fi
echo "release check: the wheel installs and runs the quickstart (spanner-queues $VERSION; Django 5.2${PY312:+ and 6.0})"

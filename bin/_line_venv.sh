#!/usr/bin/env bash
# The virtualenv of one supported line besides .venv's (bin/test): .venvs/<name>, on Python
# <version>, with the project (editable) and its extras, and the Django release of the line.
# Re-installs only when pyproject.toml, emulator/pyproject.toml or the line changed.
# Usage: bin/_line_venv.sh NAME PYTHON_VERSION DJANGO_SPEC EXTRAS [FRONT]
#   e.g. bin/_line_venv.sh django-6.0 3.12 'django>=6.0,<6.1' test,spanner,postgres front
#   (FRONT: also install the emulator front, emulator/, for native queues)
# The interpreter: bin/_find_python.sh (SQ_PYTHON_3_12, python3.12 on PATH, or pyenv's); none
# found: exit 3 saying so.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NAME="$1" VERSION="$2" DJANGO="$3" EXTRAS="$4" FRONT="${5:-}"

PY="$("$ROOT/bin/_find_python.sh" "$VERSION")" || exit 3
VENV="$ROOT/.venvs/$NAME"
cd "$ROOT"
line="$PY $DJANGO $EXTRAS $FRONT"
stamp="$VENV/.installed-$( (cat pyproject.toml emulator/pyproject.toml; echo "$line") | sha1sum | cut -c1-12)"
compile_checkout() {  # the checkout's bytecode for this line's Python (bin/_venv.sh says why)
  "$VENV/bin/python" -m compileall -q -j 0 spanner_queues emulator/spanner_queues_emulator \
    tests >/dev/null || true
}
if [ -f "$stamp" ]; then
  compile_checkout
  exit 0
fi
echo "-- $VENV: Python $VERSION ($PY), $DJANGO, .[$EXTRAS]${FRONT:+ and the emulator front}"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
args=(-e ".[$EXTRAS]" "$DJANGO")
[ -z "$FRONT" ] || args+=(-e ./emulator)
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${args[@]}" 2>&1 \
  | grep -v "^WARNING: Location" || true
# Django 6 has django.tasks: the line runs without the django-tasks backport (the test extra's,
# for Django 5.2), as a Django 6 project does (tests/tasks checks it is absent)
if "$VENV/bin/python" -c 'import sys, django; sys.exit(django.VERSION < (6,))'; then
  "$VENV/bin/python" -m pip uninstall --quiet --yes django-tasks 2>&1 | grep -v "^WARNING" || true
fi
"$VENV/bin/python" -c 'import django, pytest_django, spanner_queues; print("Django", django.get_version())'
compile_checkout
rm -f "$VENV"/.installed-* && touch "$stamp"

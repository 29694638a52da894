# Sourced by bin/demo and bin/test: create .venv and install the project with its test extra, and
# the emulator front (emulator/, the distribution spanner-queues-emulator) beside it.
# Re-installs only when either pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml emulator/pyproject.toml | sha1sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test,spanner,postgres]' -e ./emulator 2>&1 \
    | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import django, django_spanner, environ, pytest_django, spanner_queues_emulator"
  rm -f .venv/.installed-* && touch "$stamp"
fi
# The checkout's bytecode, written once (compileall writes only what changed): with
# PYTHONDONTWRITEBYTECODE set, as on these machines, every Python process the tests start (each
# worker, the emulator front) compiled again every module of the checkout it imported, about
# 0.45 s of CPU for a worker's start (docs/benchmarks.md, "Bytecode").
.venv/bin/python -m compileall -q -j 0 spanner_queues emulator/spanner_queues_emulator tests \
  demo_project benchmarks >/dev/null || true
export PATH="$ROOT/.venv/bin:$PATH"

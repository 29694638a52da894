#!/usr/bin/env bash
# Print the path of a Python <version> interpreter (bin/_line_venv.sh, bin/_release_check.sh):
# $SQ_PYTHON_3_12 (for 3.12; likewise SQ_PYTHON_3_13) if set, else python3.12 on PATH if it
# runs (pyenv puts a shim on PATH for every installed version, but it runs only the selected
# ones), else pyenv's (`pyenv prefix 3.12`). None found: exit 3 saying so on stderr.
# Usage: bin/_find_python.sh VERSION
set -euo pipefail
VERSION="$1"
VAR="SQ_PYTHON_${VERSION//./_}"

is_version() {  # is_version PYTHON: PYTHON runs and is Python $VERSION
  "$1" -c 'import sys; sys.exit(f"{sys.version_info[0]}.{sys.version_info[1]}" != sys.argv[1])' \
    "$VERSION" >/dev/null 2>&1
}

if [ -n "${!VAR:-}" ]; then
  if is_version "${!VAR}"; then
    echo "${!VAR}"
    exit 0
  fi
  echo "$VAR=${!VAR} is not a Python $VERSION that runs" >&2
  exit 3
fi
if command -v "python$VERSION" >/dev/null && is_version "python$VERSION"; then
  command -v "python$VERSION"
  exit 0
fi
if command -v pyenv >/dev/null && prefix="$(pyenv prefix "$VERSION" 2>/dev/null)" \
  && is_version "$prefix/bin/python$VERSION"; then
  echo "$prefix/bin/python$VERSION"
  exit 0
fi
echo "no Python $VERSION: set $VAR, or put python$VERSION on PATH, or \`pyenv install $VERSION\`" >&2
exit 3

#!/usr/bin/env bash
# Install taso-egg for development: find a Python >= 3.12 (egglog 14 needs it), make
# .venv in the repository root with it, and pip install the package editable with its
# dev extras, ray (the generator's --ray, which tests/test_ray_workers.py runs) and the
# peers (bench --peers, which tests/test_peers.py runs).
#
#   bash scripts/install.sh           # create .venv, or install into the one there
#   bash scripts/install.sh --fresh   # delete .venv first (CI does this)
#   PYTHON=/path/to/python3.12 bash scripts/install.sh   # use this interpreter
#
# `python3.12` on PATH may be a pyenv shim that fails unless a pyenv version is
# selected; every candidate is therefore run, not just looked up, and pyenv's own
# installs are tried directly.
set -euo pipefail
cd "$(dirname "$0")/.."

fresh=0
for arg in "$@"; do
  case "$arg" in
    --fresh) fresh=1 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
  esac
done

# Prints the path of the interpreter when it runs and is >= 3.12.
usable() {
  "$1" -c 'import sys; assert sys.version_info >= (3, 12); print(sys.executable)' 2>/dev/null
}

pyenv_root="${PYENV_ROOT:-$HOME/.pyenv}"
if command -v pyenv >/dev/null 2>&1; then
  pyenv_root="$(pyenv root 2>/dev/null || echo "$pyenv_root")"
fi

if [ -n "${PYTHON:-}" ] && ! usable "$PYTHON" >/dev/null; then
  echo "install.sh: PYTHON=$PYTHON is not a working Python >= 3.12" >&2
  exit 1
fi
PY=""
shopt -s nullglob
for cand in ${PYTHON:+"$PYTHON"} python3.12 "$pyenv_root"/versions/3.12*/bin/python3.12 \
            /usr/bin/python3.12 /usr/local/bin/python3.12 \
            python3.13 "$pyenv_root"/versions/3.13*/bin/python3.13 python3; do
  if PY="$(usable "$cand")" && [ -n "$PY" ]; then
    break
  fi
  PY=""
done
shopt -u nullglob
if [ -z "$PY" ]; then
  echo "install.sh: no Python >= 3.12 found (tried \$PYTHON, python3.12, pyenv's versions, python3.13, python3); install one or set PYTHON=/path/to/python3.12" >&2
  exit 1
fi

if [ "$fresh" = 1 ]; then
  rm -rf .venv
fi
echo "install.sh: $("$PY" --version) from $PY -> .venv" >&2
"$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev,ray,peers]"
echo "install.sh: installed; run .venv/bin/taso-egg --help" >&2

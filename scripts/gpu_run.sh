#!/usr/bin/env bash
# The GPU run, one command on the device machine (issue 20): the per-operator CuPy
# profile and the end-to-end comparison of every bundled zoo model, everything
# written under $OUT, within 8 minutes. Needs the bundle that scripts/gpu_prepare.sh
# builds here (build/gpu-bundle, carried: it is git-ignored).
#
#   OUT=/some/folder scripts/gpu_run.sh [gpu_run options, e.g. --budget 300]
#
# The package runs from the working tree, without pip install: its folders are
# staged as pyproject.toml's package-dir maps them, and PYTHONPATH points there.
# TASO_EGG_BUNDLE overrides the bundle's folder, PYTHON the interpreter.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
: "${OUT:?set OUT to the folder to write into}"
bundle="${TASO_EGG_BUNDLE:-$root/build/gpu-bundle}"
python="${PYTHON:-python3}"
if [ ! -f "$bundle/configs.json" ] || [ ! -f "$bundle/graphs.json" ]; then
  echo "gpu_run.sh: no bundle in $bundle: run scripts/gpu_prepare.sh on the CPU machine and carry build/gpu-bundle" >&2
  exit 2
fi
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
bundle="$(cd "$bundle" && pwd)"
case "$python" in */*) python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")" ;; esac
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
# pyproject.toml's package-dir: taso_egg.rules = rules, .extract = extract, .profiles = profiles
cp -r "$root/taso_egg" "$stage/taso_egg"
for sub in rules extract profiles; do
  rm -rf "$stage/taso_egg/$sub"
  cp -r "$root/$sub" "$stage/taso_egg/$sub"
done
export PYTHONPATH="$stage${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if command -v nvidia-smi >/dev/null; then
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
fi
cd "$stage"  # python -m puts the working folder first on sys.path
# gpu_run stops itself at its --budget (420 s by default); timeout is the backstop,
# and its SIGTERM still makes gpu_run write what it measured.
timeout -k 15 465 "$python" -m taso_egg.profiling.gpu_run --bundle "$bundle" --out "$OUT" "$@" 2>&1 \
  | tee "$OUT/gpu-run.log"

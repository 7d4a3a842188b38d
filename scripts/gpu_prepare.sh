#!/usr/bin/env bash
# Build the GPU run's bundle here, on the CPU machine (issue 20): the eight zoo models
# optimized under the GPU cost model (profiles/gpu-h200.json when shipped, else H200
# datasheet figures), their graphs as deployed without weight data, and the list of
# every operator configuration to profile. Writes build/gpu-bundle (git-ignored; the
# device run carries it: carry ["build/gpu-bundle"]). Extra arguments go to
# python -m taso_egg.profiling.prepare (e.g. --models bert vgg19, --cost-model PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m taso_egg.profiling.prepare -o build/gpu-bundle "$@"

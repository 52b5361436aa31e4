#!/usr/bin/env bash
# digits_cnn on the embedded digits with 2 ranks (about a minute, most of it compiling).
set -euo pipefail
cd "$(dirname "$0")/../.."
export THEANOMPI_EXT_CACHE=${THEANOMPI_EXT_CACHE:-$PWD/.cache/theano} OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
exec .venv/bin/theanompi-ext train --workers "${WORKERS:-2}" --config examples/cpu/digits_cnn.cfg \
    --out "${OUT:-runs/digits_cnn}" "$@"

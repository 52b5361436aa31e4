#!/usr/bin/env bash
# ResNet-20 on an HDF5 copy of the digits with 2 ranks: convert, then train.
set -euo pipefail
cd "$(dirname "$0")/../.."
export THEANOMPI_EXT_CACHE=${THEANOMPI_EXT_CACHE:-$PWD/.cache/theano} OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p runs
[ -f runs/digits.h5 ] || .venv/bin/theanompi-ext convert sklearn:digits runs/digits.h5
exec .venv/bin/theanompi-ext train --workers "${WORKERS:-2}" --config examples/cpu/resnet20_digits_h5.cfg \
    --out "${OUT:-runs/resnet20}" "$@"

#!/usr/bin/env bash
# The CPU-scale Table 1 of docs/experiments.md: 4 settings x RUNS runs of
# digits_cnn on 2 MPI ranks; prints the table, writes OUT/trials.json and
# OUT/trials.png. 20 runs: 15-30 minutes on 2 cores (30 on a busy machine).
# SETTINGS=examples/cpu/wire.settings: Table 1's baseline and gradual settings
# with a float32 and a float16 gradient wire (docs/performance.md, section 3).
set -euo pipefail
cd "$(dirname "$0")/../.."
export THEANOMPI_EXT_CACHE=${THEANOMPI_EXT_CACHE:-$PWD/.cache/theano} OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
exec .venv/bin/theanompi-ext trials --runs "${RUNS:-5}" --settings "${SETTINGS:-examples/cpu/table1.settings}" \
    --workers 2 --model digits_cnn --epochs 30 --base-lr 0.4 --ref-batch 16 \
    --warmup-epochs 5 --decay-epochs 10,20,27 --momentum 0.9 --nesterov \
    --weight-decay 1e-4 --exch-strategy ar --bucket-cap-mb 4 --first-bucket-cap-mb 1 \
    --out "${OUT:-runs/table1}" "$@"

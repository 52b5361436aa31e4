#!/usr/bin/env bash
# Per-rank wrapper: give this rank the GPU of its node-local rank, then run the
# command. Theano then sees one device, cuda0 (THEANO_FLAGS set below; flags
# the user already set win, see theanompi_ext/engine/core.py).
#
# Needs Theano's GPU backend (pygpu + libgpuarray, from conda-forge); not
# installable from PyPI, hence untested here (docs/gpu.md).
set -euo pipefail
LOCAL=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-0}}}
export CUDA_VISIBLE_DEVICES=$LOCAL
export THEANO_FLAGS="device=cuda0,gpuarray__preallocate=0.9${THEANO_FLAGS:+,$THEANO_FLAGS}"
# A per-rank compile cache directory avoids lock contention between the
# ranks of one node while they compile the same graph.
export THEANOMPI_EXT_CACHE="${THEANOMPI_EXT_CACHE:-/tmp/theanompi-ext-cache}/gpu$LOCAL"
exec "$@"

#!/usr/bin/env bash
# Launch a training run across GPU nodes: one MPI rank per GPU.
#
#   examples/cluster/launch.sh CONFIG HOSTFILE GPUS_PER_NODE OUT [train options...]
#   e.g. examples/cluster/launch.sh examples/cluster/resnet50_goyal2017.cfg hosts 8 runs/r50-8k
#
# The number of ranks is (nodes in HOSTFILE) x GPUS_PER_NODE; with n = 32 per
# rank, 32 nodes x 8 GPUs is the paper's 8k minibatch. Every rank runs
# `theanompi-ext train` inside mpirun, so no rank starts another launcher.
#
# STATUS: the launch line is the intended one, but it has not been run on GPUs.
# Theano's GPU backend needs pygpu/libgpuarray, which no registry this project
# can reach provides (docs/gpu.md); without it Theano runs on the CPU and this
# script still works as a multi-node CPU launch (set GPU=0).
set -euo pipefail

if [ "$#" -lt 4 ]; then
    sed -n '2,15p' "$0"
    exit 2
fi
CONFIG=$1; HOSTFILE=$2; GPUS_PER_NODE=$3; OUT=$4; shift 4
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${VENV:-$(cd "$HERE/../.." && pwd)/.venv}
GPU=${GPU:-1}

NODES=$(grep -cEv '^[[:space:]]*(#|$)' "$HOSTFILE")
NP=${NP:-$((NODES * GPUS_PER_NODE))}
# A node-local compile cache: hundreds of ranks locking one cache on a shared
# file system serialise their compiles.
export THEANOMPI_EXT_CACHE=${THEANOMPI_EXT_CACHE:-/tmp/$USER/theanompi-ext-cache}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export GPU

WRAP=()
if [ "$GPU" = 1 ]; then
    WRAP=("$HERE/bind_gpu.sh")
fi
TRAIN=("$VENV/bin/theanompi-ext" train --config "$CONFIG" --out "$OUT" "$@")

MPIRUN=${MPIRUN:-mpirun}
if "$MPIRUN" --version 2>/dev/null | grep -q 'Open MPI'; then
    set -x
    exec "$MPIRUN" -np "$NP" --hostfile "$HOSTFILE" --map-by "ppr:${GPUS_PER_NODE}:node" \
        --bind-to none -x PATH -x LD_LIBRARY_PATH -x THEANOMPI_EXT_CACHE -x OMP_NUM_THREADS \
        -x NCCL_DEBUG -x NCCL_SOCKET_IFNAME -x GPU "${WRAP[@]}" "${TRAIN[@]}"
else
    # MPICH / Intel MPI (hydra): hostfile lines "node:slots"
    set -x
    exec "$MPIRUN" -n "$NP" -f "$HOSTFILE" -ppn "$GPUS_PER_NODE" \
        -genvlist PATH,LD_LIBRARY_PATH,THEANOMPI_EXT_CACHE,OMP_NUM_THREADS,NCCL_DEBUG,GPU \
        "${WRAP[@]}" "${TRAIN[@]}"
fi

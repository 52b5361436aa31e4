#!/bin/bash
# On the lent GPU machine (16 cores): the overlapped ResNet-20 step on 2 x 2 emulated hosts,
# 200 Mbit/s between them, beside DDP (issue #28, item 4; docs/exchange-across-hosts.md).
# Needs scripts/device_theano_pack.sh's .devscratch carried: `run` with
#   command: bash scripts/device_theano_hosts.sh    carry: [".devscratch"]
# Environment: BATCH (8), LAUNCHES (1), REPS (6), T2 (seconds for the measurement, 330),
# QUEUES (the link queues bench hosts compares first, '1s 50ms'; empty: none).
# The cold compile of ResNet-20's modules took 183 s there (g++ 13.3), of 15 min of device time.
export PYTHONUNBUFFERED=1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
DDP=$(command -v python3)            # the image's Python, which holds PyTorch
el "cores $(nproc); kernel $(uname -r); DDP's python $DDP"
if ! command -v g++ >/dev/null; then
    el "no g++ here: Theano cannot compile"; exit 3
fi
g++ --version | head -1
tar -C / -xJf .devscratch/py311.tar.xz || { el "unpack failed"; exit 4; }
V=$(tar -tJf .devscratch/py311.tar.xz | grep -m1 -o '^\./.*/\.venv/' | sed 's/^\.//')
export PATH=$V/bin:$PWD/.devscratch/netbin/bin:$PATH PYTHONPATH=$PWD THEANOMPI_EXT_CACHE=/tmp/tcache
python -c "import theanompi_ext.engine.core as c; print('theano', c.theano.__version__, 'cxx', c.theano.config.cxx)" || exit 5
"$DDP" -c "import torch; print('torch', torch.__version__)" || DDP=
ip -V || exit 6
# The links' queue (docs/exchange-across-hosts.md, "The links' queue"): the 16 MB
# allreduce on 2 x 2 and 4 x 1 with the lossless default and with the shallow 50 ms
# queue; about 1.5 min per queue on 16 cores. QUEUES= skips it.
for q in ${QUEUES-1s 50ms}; do
    for l in "2 2" "4 1"; do
        set -- $l
        el "bench hosts ${1}x$2, queue $q"
        timeout 150 python -m theanompi_ext bench hosts --hosts "$1" --ranks-per-host "$2" \
            --sizes 4M,16M --reps 7 --queue "$q" --json "$OUT/hosts_${1}x${2}_$q.json" 2>&1 \
            | tee "$OUT/hosts_${1}x${2}_$q.log" | grep -E "MB|drops|within"
    done
done
el "compile (one job on one host; the cache then serves every rank)"
timeout 240 python -m theanompi_ext bench compare --models resnet20 --batch "${BATCH:-8}" --no-ddp \
    --launches 1 --reps 1 --timeout 230 2>&1 | tail -3
el "measure"
timeout "${T2:-330}" python -m theanompi_ext bench compare --models resnet20 --batch "${BATCH:-8}" \
    --network hosts:2x2:200mbit --wire-dtype float32,float16 \
    ${DDP:+--ddp-python "$DDP" --ddp-bucket-cap-mb 0.1} \
    --launches "${LAUNCHES:-1}" --reps "${REPS:-6}" --timeout "$(( ${T2:-330} - 10 ))" \
    --json "$OUT/compare_2x2.json" 2>&1 | tee "$OUT/compare_2x2.log"
el "done"

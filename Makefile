# Two commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO_STRATEGY ?= ar-overlap
# One Theano compile cache for the whole project (ignored by git).
export THEANOMPI_EXT_CACHE := $(CURDIR)/.cache/theano
# One BLAS thread per rank: ranks, not threads, use the cores.
export OMP_NUM_THREADS := 1
export OPENBLAS_NUM_THREADS := 1
# pocl (OpenCL on the CPU) compiles its kernels once into this cache (a folder per rank).
export POCL_CACHE_DIR := $(CURDIR)/.cache/pocl
# The GPU path's system packages (docs/gpu.md); not needed for the CPU path.
# Pinned to the Debian 12 versions measured to work; `make gpu-deps GPU_APT=...`
# overrides them on another release.
GPU_APT := python3-pygpu=0.7.6-13+b1 libgpuarray-dev=0.7.6-13+b1 \
           libgpuarray3=0.7.6-13+b1 pocl-opencl-icd=3.1-3+deb12u1

.PHONY: install demo test clean gpu-deps

install: $(STAMP)

$(STAMP): setup.py requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

demo: install
	$(VENV)/bin/theanompi-ext train --workers 2 --model digits_cnn --epochs 8 \
	    --batch-per-worker 32 --base-lr 0.05 --ref-batch 32 --warmup-epochs 2 \
	    --decay-epochs 6 --exch-strategy $(DEMO_STRATEGY) \
	    --out runs/demo --overwrite

test: install
	$(PY) -m pytest -q tests

# As root: Debian's pygpu/libgpuarray and pocl, linked into the venv.
gpu-deps: install
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(GPU_APT)
	$(PY) scripts/link_pygpu.py

clean:
	rm -rf $(VENV) .cache runs

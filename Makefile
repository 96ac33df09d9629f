# Two entry points (see README Quickstart): `make run` and `make test`.
# Each creates .venv on first use: the package with every extra (dev) and the tested torch build (the "pinned"
# extra: pyproject.toml is the one place torch's version is named), then compiles the numba kernels once
# (fusebench-warmup), so that no run pays for compiling them.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
KERNELS := src/fusebench/runtime/jit.py src/fusebench/search/topk_kernels.py src/fusebench/search/row_kernels.py \
           src/fusebench/encoders/rownorm.py src/fusebench/search/warmup.py

.PHONY: run test test-fast lint bench venv warmup clean

venv: $(VENV)/.installed $(VENV)/.compiled

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev,pinned]'
	@touch $@

# numba's disk cache of every kernel; compiled again when a kernel source changes (the cache key covers them all)
$(VENV)/.compiled: $(VENV)/.installed $(KERNELS)
	$(BIN)/fusebench-warmup
	@touch $@

warmup: $(VENV)/.installed
	$(BIN)/fusebench-warmup

run: venv
	$(BIN)/fusebench $(ARGS)

test: venv
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: venv  # the unit tier: no whole jobs, sweeps, subprocesses, notebook or case of 0.1 s or more
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check src tests scripts

bench: venv
	$(BIN)/python scripts/bench_eval.py --cli --distractors

clean:
	rm -rf $(VENV) outputs multirun

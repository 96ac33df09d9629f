# Two entry points (see README Quickstart): `make run` and `make test`.
# Each creates .venv on first use. torch/torchvision are pinned first so pip
# does not pick an unrelated build; everything else comes from pyproject.toml.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_PINS ?= torch==2.14.1 torchvision==0.29.1

.PHONY: run test test-fast lint bench venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(TORCH_PINS)
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

run: venv
	$(BIN)/fusebench $(ARGS)

test: venv
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: venv  # the unit tier: no whole jobs, sweeps, subprocesses or notebook
	$(BIN)/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check src tests scripts

bench: venv
	$(BIN)/python scripts/bench_eval.py --cli --distractors

clean:
	rm -rf $(VENV) outputs multirun

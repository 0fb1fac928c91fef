# Two set-up commands: `make run` and `make test`. Both create .venv and install first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast test-slow install deploy bench clean

# torch with pip: the CPU wheel on local disk (uv does not look there), pinned before anything asks for torch.
# The rest with uv: 20 s against pip's 72 s for the same versions (2026-12-06); pip where uv cannot reach PyPI.
# Both compile the bytecode as they install: where PYTHONDONTWRITEBYTECODE is set (this machine, CI) nothing
# compiles it later, and every process then compiled its imports anew (transformers, Ray, Prefect and MLflow:
# 5.0 CPU-s instead of 3.0; the suite took 1,490 s instead of ~900).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0 uv==0.13.9
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -e '.[test]' || $(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/miles train --config configs/tiny-cpu.yaml --use-wandb --use-mlflow

# the suite's models (tiny addition and tool models, SmolLM2) made once per machine before the suite, one per core
test: $(STAMP)
	$(BIN)/python -m tests.support.warm_cache
	$(BIN)/python -m pytest -q --durations=25 -n 2 tests

test-fast: $(STAMP)
	$(BIN)/python -m tests.support.warm_cache
	$(BIN)/python -m pytest -q -m "not slow" tests

test-slow: $(STAMP)
	$(BIN)/python -m tests.support.warm_cache
	$(BIN)/python -m pytest -q -m slow tests

deploy: $(STAMP)
	$(BIN)/python -m flows.deploy

bench: $(STAMP)
	for b in benchmarks/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf runs .pytest_cache

# Two set-up commands: `make run` and `make test`. Both create .venv and install first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-fast test-slow install deploy bench clean

# torch with pip: the CPU wheel on local disk (uv does not look there), pinned before anything asks for torch;
# its bytecode is compiled as modules are first imported, as uv leaves it (6.7 s against 19.2 s compiling all).
# The rest with uv: 8 s against pip's 72 s for the same versions (2026-12-06); pip where uv cannot reach PyPI.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile torch==2.13.0 uv==0.13.9
	$(BIN)/uv pip install -q --python $(BIN)/python -e '.[test]' || $(BIN)/pip install -q -e '.[test]'
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

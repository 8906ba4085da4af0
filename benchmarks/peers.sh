#!/usr/bin/env bash
# Fair peer run: prefix-router, SGLang's router (sglang-router 0.3.2) and vLLM's router (vllm-router
# 0.1.17), each as its own process, in front of the SAME simulated engines, driven by the SAME client
# (`prefix-router bench --router URL`), over a matrix of workloads x load levels (benchmarks/peers.py).
#
#   benchmarks/peers.sh                                   # the whole matrix (~40 min); results in $OUT
#   benchmarks/peers.sh --workloads mixed --loads hot --repeats 1 --requests 200   # one cell, quickly
#
# - The peers are installed into their own venv ($PEERS_VENV, default /tmp/peers), never the project's.
# - benchmarks/nodelay_shim.c is compiled here into /tmp (never committed as a binary): the peers'
#   "+nodelay" rows preload it, which sets TCP_NODELAY on the connections they accept (sglang-router
#   0.3.2 does not; a transport artefact, reported apart from routing).
# - All numbers come from SIMULATED engines (prefix-router engine-sim, vLLM-compatible).
set -euo pipefail
cd "$(dirname "$0")/.."

PEERS_VENV=${PEERS_VENV:-/tmp/peers}
OUT=${OUT:-/tmp/prefix-router-peers}
SHIM=${SHIM:-/tmp/prefix-router-nodelay-shim.so}
PY=.venv/bin/python

if [[ ! -x "$PEERS_VENV/bin/vllm-router" || ! -x "$PEERS_VENV/bin/python" ]] \
   || ! "$PEERS_VENV/bin/python" -c "import sglang_router" 2>/dev/null; then
  python3 -m venv "$PEERS_VENV"
  "$PEERS_VENV/bin/pip" install --quiet sglang-router==0.3.2 vllm-router==0.1.17
fi
gcc -O2 -Wall -Wextra -shared -fPIC -o "$SHIM" benchmarks/nodelay_shim.c -ldl

mkdir -p "$OUT"
status=0
"$PY" benchmarks/peers.py --out "$OUT" --peers-venv "$PEERS_VENV" --shim "$SHIM" "$@" || status=$?
"$PY" benchmarks/peers_table.py "$OUT" --json "$OUT/peers.json" --markdown "$OUT/peers.md" --plot "$OUT/peers.png"
echo "results: $OUT/peers.md, $OUT/peers.json, $OUT/peers.png (per run: $OUT/<workload>-<load>/)"
exit "$status"

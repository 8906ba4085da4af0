#!/usr/bin/env bash
# Peer comparison: prefix-router, SGLang's router (sglang-router) and vLLM's router (vllm-router) in front
# of the SAME four simulated engines, on the SAME workload (the demo's), one router at a time.
#
#   benchmarks/peers.sh                # results in $OUT (default /tmp/prefix-router-peers)
#   REQUESTS=300 RATE=10 benchmarks/peers.sh
#
# Every router runs as its own process on loopback; before each router's run the engines' prefix caches
# are flushed (POST /reset_prefix_cache), so every router starts cold. The peers are installed into their
# own venv (/tmp/peers), never into the project's. All numbers come from SIMULATED engines.
set -euo pipefail
cd "$(dirname "$0")/.."

PEERS_VENV=${PEERS_VENV:-/tmp/peers}
OUT=${OUT:-/tmp/prefix-router-peers}
PORT_BASE=${PORT_BASE:-18500}
REQUESTS=${REQUESTS:-300}
RATE=${RATE:-10}
SEED=${SEED:-0}
PR=.venv/bin/prefix-router
PY=.venv/bin/python

if [[ ! -x "$PEERS_VENV/bin/vllm-router" || ! -x "$PEERS_VENV/bin/python" ]] \
   || ! "$PEERS_VENV/bin/python" -c "import sglang_router" 2>/dev/null; then
  python3 -m venv "$PEERS_VENV"
  "$PEERS_VENV/bin/pip" install --quiet sglang-router==0.3.2 vllm-router==0.1.17
fi
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/*.log

PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT INT TERM

wait_health() {  # URL
  for _ in $(seq 1 150); do
    curl -fsS -m 2 "$1/health" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "no answer from $1/health" >&2
  return 1
}

# --- four simulated engines: the demo's setting (8B/H100 timing, 20,480-token KV cache each)
WORKERS=()
for i in 1 2 3 4; do
  port=$((PORT_BASE + i))
  "$PR" engine-sim --port "$port" --profile llama-3.1-8b-h100 --kv-capacity-tokens 20480 \
    >"$OUT/engine-$port.log" 2>&1 &
  PIDS+=($!)
  WORKERS+=("http://127.0.0.1:$port")
done
for w in "${WORKERS[@]}"; do wait_health "$w"; done

# --- the routers, one process each
declare -A ROUTERS
start_prefix_router() {  # LABEL PORT POLICY
  local flags=()
  for w in "${WORKERS[@]}"; do flags+=(--worker "$w"); done
  "$PR" serve "${flags[@]}" --policy "$3" --port "$2" --set log_level=warning >"$OUT/$1.log" 2>&1 &
  PIDS+=($!)
  ROUTERS[$1]="http://127.0.0.1:$2"
}
start_prefix_router "prefix-router random" $((PORT_BASE + 101)) random
start_prefix_router "prefix-router prefix" $((PORT_BASE + 102)) prefix

HF_HUB_OFFLINE=1 HF_ENDPOINT=http://127.0.0.1:9 "$PEERS_VENV/bin/python" -m sglang_router.launch_router \
  --host 127.0.0.1 --port $((PORT_BASE + 103)) --worker-urls "${WORKERS[@]}" --policy cache_aware \
  --prometheus-host 127.0.0.1 --prometheus-port $((PORT_BASE + 113)) --log-level warn \
  >"$OUT/sglang-router.log" 2>&1 &
PIDS+=($!)
ROUTERS["sglang-router cache_aware"]="http://127.0.0.1:$((PORT_BASE + 103))"

"$PEERS_VENV/bin/vllm-router" --host 127.0.0.1 --port $((PORT_BASE + 104)) --worker-urls "${WORKERS[@]}" \
  --policy cache_aware --prometheus-host 127.0.0.1 --prometheus-port $((PORT_BASE + 114)) \
  --log-level warning >"$OUT/vllm-router.log" 2>&1 &
PIDS+=($!)
ROUTERS["vllm-router cache_aware"]="http://127.0.0.1:$((PORT_BASE + 104))"

for url in "${ROUTERS[@]}"; do wait_health "$url"; done

# --- one benchmark per router: same workers, same workload (the demo's mixed setting), same seed
ORDER=("prefix-router random" "prefix-router prefix" "sglang-router cache_aware" "vllm-router cache_aware")
for label in "${ORDER[@]}"; do
  file="$OUT/$(echo "$label" | tr ' ' '_').json"
  echo "== $label (${ROUTERS[$label]})"
  "$PR" bench --workers "${WORKERS[@]}" --router "${ROUTERS[$label]}" --label "$label" \
    --workload mixed --requests "$REQUESTS" --rate "$RATE" --seed "$SEED" \
    --workload-opt tenants=32 --workload-opt system_tokens=2048 --workload-opt zipf_s=0.6 \
    --workload-opt output_tokens=16 --workload-opt max_output_tokens=32 \
    --no-progress --json "$file" >/dev/null
done

"$PY" benchmarks/peers_table.py "$OUT"/*.json --baseline "prefix-router random" \
  --json "$OUT/peers.json" --markdown "$OUT/peers.md"
echo "results: $OUT/peers.md, $OUT/peers.json"

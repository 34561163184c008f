#!/usr/bin/env bash
# Plain vs speculative decoding with the verifier on two RPC workers behind a latency proxy,
# on one machine: `specgguf bench --rpc` at each one-way delay D (ms).
#   scripts/rpc_latency_bench.sh "0 1 5" --quick            # default pair
#   scripts/rpc_latency_bench.sh "0 1 5" --quick --only-f16 # F16 verifier
# Extra arguments go to `specgguf bench`. Workers and client use one thread each (-t 1).
set -euo pipefail
delays=${1:-"0 1 5"}; shift || true
SPECGGUF=${SPECGGUF:-"python -m specgguf"}
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
free_port() { python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
w1=$(free_port); w2=$(free_port)
$SPECGGUF worker --port "$w1" -t 1 >/dev/null 2>&1 & pids+=($!)
$SPECGGUF worker --port "$w2" -t 1 >/dev/null 2>&1 & pids+=($!)
sleep 3
for delay in $delays; do
    p1=$(free_port); p2=$(free_port)
    python "$(dirname "$0")/rpc_latency_proxy.py" --delay-ms "$delay" \
        "127.0.0.1:$p1=127.0.0.1:$w1" "127.0.0.1:$p2=127.0.0.1:$w2" >/dev/null & proxy=$!
    sleep 1
    echo "=== one-way delay ${delay} ms: specgguf bench --rpc 127.0.0.1:$p1,127.0.0.1:$p2 -t 1 $*"
    $SPECGGUF bench --rpc "127.0.0.1:$p1,127.0.0.1:$p2" -t 1 "$@"
    kill "$proxy"; wait "$proxy" 2>/dev/null || true
done

#!/usr/bin/env bash
# Runs the load tool end to end on this machine: a private redis-server on a
# loopback port, a Warble server on it with RATE_LIMITS=off, then
# internal/loadtest against both. Arguments go to the tool, e.g.
#   internal/loadtest/run.sh -users 2000 -runs 5 -duration 3s
# CI runs it on a tiny graph to prove it works:
#   internal/loadtest/run.sh -users 30 -posts 2 -runs 1 -duration 200ms -concurrency 4
set -euo pipefail
cd "$(dirname "$0")/../.."

dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
redis_port=$(free_port)
http_port=$(free_port)

redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
pids+=($!)
go build -o "$dir/warble" .
go build -o "$dir/loadtest" ./internal/loadtest
for _ in $(seq 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done

REDIS_URL="redis://127.0.0.1:$redis_port/0" RATE_LIMITS=off HOST=127.0.0.1 PORT="$http_port" LOG_LEVEL=warn \
  "$dir/warble" >"$dir/warble.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -fsS "http://127.0.0.1:$http_port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done

"$dir/loadtest" -url "http://127.0.0.1:$http_port" -redis-url "redis://127.0.0.1:$redis_port/0" "$@" || {
  echo "--- warble log"; tail -50 "$dir/warble.log"; exit 1
}

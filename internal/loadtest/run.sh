#!/usr/bin/env bash
# Runs the load tool end to end on this machine: a private redis-server on a
# unix socket, a Warble server on it with RATE_LIMITS=off (or as the
# environment sets it: with RATE_LIMITS=on, set limits the tool's users stay
# under too, e.g. RATE_LIMIT_POSTS_PER_USER=1000000000/1h0m0s/1000000), then
# internal/loadtest against both. Arguments go to the tool, e.g.
#   internal/loadtest/run.sh -users 2000 -runs 5 -duration 3s
# CI runs it on a tiny graph to prove it works:
#   internal/loadtest/run.sh -users 30 -posts 2 -runs 1 -duration 200ms -concurrency 4
# With --cluster first, Redis is a 3-master Redis Cluster on loopback
# (internal/redistest/cmd/redis-cluster) instead of one redis-server, and
# with --cluster-replicas the same with a replica per master (writes then
# wait for a replica, unless REDIS_WAIT_REPLICAS=off is set):
#   internal/loadtest/run.sh --cluster -users 2000 -runs 5
# The server gets FANOUT_PULL_THRESHOLD (default here 1000000, above every
# fan-out size the tool times) so that fan-out is measured on the push path;
# set it in the environment to measure another. The tool is told the value
# for its report, and the commit measured. With -compact-homes N, the tool
# also fills N home timelines to the cap under each sorted-set listpack
# limit (-listpack-entries, default 128 and the cap plus 128) and reports their
# memory and the fan-out to them:
#   internal/loadtest/run.sh -fanout-sizes 10000 -compact-homes 10000
# With -sockets N, the tool opens N live subscribers on the server and reads
# the server's RSS (it is given the server's pid); -sockets-only skips the
# rest:
#   internal/loadtest/run.sh -users 2 -posts 0 -sockets 10000 -sockets-only
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

cluster=
replicas=0
case "${1:-}" in
  --cluster) cluster=1; shift ;;
  --cluster-replicas) cluster=1; replicas=1; shift ;;
esac

go build -o "$dir/warble" .
go build -o "$dir/loadtest" ./internal/loadtest
if [ -n "$cluster" ]; then
  go build -o "$dir/redis-cluster" ./internal/redistest/cmd/redis-cluster
  "$dir/redis-cluster" -replicas "$replicas" >"$dir/redis.log" 2>&1 &
  pids+=($!)
  redis_url=
  for _ in $(seq 600); do
    redis_url=$(grep -m1 '^redis://' "$dir/redis.log" || true)
    [ -n "$redis_url" ] && break
    sleep 0.1
  done
  if [ -z "$redis_url" ]; then echo "the Redis Cluster did not start:"; cat "$dir/redis.log"; exit 1; fi
else
  redis-server --port 0 --unixsocket "$dir/redis.sock" --save '' --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do redis-cli -s "$dir/redis.sock" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis_url="unix://$dir/redis.sock"
fi

# Each live subscriber is a descriptor in the server and one in the tool.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

pull_threshold=${FANOUT_PULL_THRESHOLD:-1000000}
commit=$(git describe --always --dirty 2>/dev/null || echo unknown)

# PORT=0: the kernel picks a free port, which the server logs.
# FOLLOWERS_BUCKET_THRESHOLD and FOLLOWERS_BUCKETS, when set, go to the
# server and to the tool, whose raw seed puts followers where the server
# keeps them.
bucket_args=()
[ -n "${FOLLOWERS_BUCKET_THRESHOLD:-}" ] && bucket_args+=(-bucket-threshold "$FOLLOWERS_BUCKET_THRESHOLD")
[ -n "${FOLLOWERS_BUCKETS:-}" ] && bucket_args+=(-buckets "$FOLLOWERS_BUCKETS")
# HOME_TIMELINE_CAP, when set, goes to the server and to the tool, whose
# -compact-homes fills home timelines to it.
[ -n "${HOME_TIMELINE_CAP:-}" ] && bucket_args+=(-home-cap "$HOME_TIMELINE_CAP")

REDIS_URL="$redis_url" RATE_LIMITS="${RATE_LIMITS:-off}" HOST=127.0.0.1 PORT=0 LOG_LEVEL=info \
  FANOUT_PULL_THRESHOLD="$pull_threshold" \
  "$dir/warble" >"$dir/warble.log" 2>&1 &
warble_pid=$!
pids+=($warble_pid)
url=
for _ in $(seq 100); do
  url=$(sed -n '/warble is listening/s/.*url=\(http:[^ ]*\).*/\1/p' "$dir/warble.log" | head -1)
  [ -n "$url" ] && break
  sleep 0.1
done
if [ -z "$url" ]; then echo "warble did not start:"; cat "$dir/warble.log"; exit 1; fi

"$dir/loadtest" -url "$url" -redis-url "$redis_url" -server-pid "$warble_pid" "${bucket_args[@]}" \
  -pull-threshold "$pull_threshold" -note "commit $commit${cluster:+, 3-master Redis Cluster with $replicas replica(s) per master, REDIS_WAIT_REPLICAS=${REDIS_WAIT_REPLICAS:-auto}}${FOLLOWERS_BUCKET_THRESHOLD:+, FOLLOWERS_BUCKET_THRESHOLD=$FOLLOWERS_BUCKET_THRESHOLD}" "$@" || {
  echo "--- warble log"; tail -50 "$dir/warble.log"; exit 1
}

#!/usr/bin/env bash
# The Redis server's instructions for one bench run: an own redis-server under callgrind
# (instructions, not seconds: the same count for the same binary and inputs however busy
# the machine is), the bench run natively against it, then the server's total and per
# delivery (preload included: compare configurations of the same N and duplicates).
#
#   bash scripts/server-instructions.sh target/release/babelqueue-bench --concurrency 32
#   N=3000 PORT=17698 bash scripts/server-instructions.sh BIN --concurrency 32 --batch 8
#
# KEEP=<file> keeps the callgrind output (for callgrind_annotate).
# Prints one line: `server_instr=<total> server_instr_per_delivery=<n> <the bench's line>`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?the bench binary}
shift
N=${N:-3000}
PORT=${PORT:-17698}
dir=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
  redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  >"$dir/server.log" 2>&1 &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  redis-cli -p "$PORT" ping >/dev/null 2>&1 && break
  sleep 0.2
done
line=$("$BIN" --url "redis://127.0.0.1:$PORT/0" --n "$N" --runs 1 "$@" 2>"$dir/err" | tail -1) || true
case "$line" in
  *msgs_per_s=*) ;;
  *) echo "no figures from the bench:" >&2; cat "$dir/err" >&2; exit 1 ;;
esac
kill -TERM "$pid"
wait "$pid" 2>/dev/null || true
[ -n "${KEEP:-}" ] && cp "$dir/cg.out" "$KEEP"
total=$(grep -m1 '^summary:' "$dir/cg.out" | awk '{print $2}')
deliveries=$(sed -n 's/.*deliveries=\([0-9]*\).*/\1/p' <<<"$line")
[ -n "$deliveries" ] || deliveries=$((N + N / 2))
echo "server_instr=$total server_instr_per_delivery=$((total / deliveries)) $line"

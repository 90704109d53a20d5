#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for N seconds each (default 30), seeded from the
# conformance fixtures, and prints runs and runs/s per target. Exits non-zero when a target
# finds a crash (its input is left in fuzz/artifacts/<target>/).
#
#   scripts/fuzz-smoke.sh [seconds] [target ...]
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`); the conformance
# suite from $BABELQUEUE_CONFORMANCE_DIR (default ../shared/conformance).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
secs="${1:-30}"
shift || true
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(envelope frame poison bindings broker_url consume gdpr_unprotect)
fi
export BABELQUEUE_CONFORMANCE_DIR="${BABELQUEUE_CONFORMANCE_DIR:-$root/../shared/conformance}"
"$root/fuzz/seed.sh"
cd "$root/fuzz"
failed=()
summary=()
for t in "${targets[@]}"; do
  log="$(mktemp)"
  echo "== fuzz $t for ${secs}s"
  # -rss_limit_mb keeps a runaway input from taking the machine; one worker (CPU is shared).
  if cargo +nightly fuzz run "$t" -- -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    status=ok
  else
    status=CRASH
    failed+=("$t")
    tail -n 40 "$log"
  fi
  runs="$(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log" | tail -1 | awk '{print $2, $5}' || true)"
  n="${runs% *}"; s="${runs#* }"
  if [[ -n "$n" && -n "$s" && "$s" -gt 0 ]]; then rate=$((n / s)); else rate="?"; fi
  summary+=("$(printf '%-12s %-6s runs=%-10s secs=%-4s runs/s=%s' "$t" "$status" "${n:-?}" "${s:-?}" "$rate")")
  rm -f "$log"
done
printf '%s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz-smoke: crash in: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi

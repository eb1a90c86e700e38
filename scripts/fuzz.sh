#!/usr/bin/env bash
# Fuzzing smoke run (cargo-fuzz, nightly): builds every target in fuzz/ and runs each for
# SECONDS (default 60) from its seeds in fuzz/seeds/<target>; fails on any crash, leak or
# timeout. Reports each target's executions. A longer local run: scripts/fuzz.sh 600
# Needs `cargo +nightly` and cargo-fuzz (installed from crates.io when missing).
# FUZZ_SANITIZER: address (default; what the long runs use) or none (CI's smoke run: a much
# faster build, and panics, overflows, OOMs and timeouts in safe Rust are still caught).
# FUZZ_DEV=1: a debug build (CI: minutes less to compile on 2 cores, fewer executions per second).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-60}"
targets="${FUZZ_TARGETS:-fleet_config url_egress sse_decoder meta_args http_front admission_diff}"
sanitizer="${FUZZ_SANITIZER:-address}"
profile=()
[ "${FUZZ_DEV:-0}" = 1 ] && profile=(--dev)
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: no nightly toolchain (cargo +nightly); skipping the fuzz run" >&2
  exit "${FUZZ_REQUIRED:-0}"
fi
cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
# `cargo fuzz build` takes one target or none (= all of them, in one cargo invocation).
# A failed build prints its compiler errors (not only cargo-fuzz's own backtrace) and stops.
build_log=$(mktemp)
build() {
  if ! cargo +nightly fuzz build "${profile[@]}" --fuzz-dir . -s "$sanitizer" "$@" >"$build_log" 2>&1; then
    grep -E -A12 '^error' "$build_log" | head -80 || tail -40 "$build_log"
    echo "fuzz: building the targets failed"
    exit 1
  fi
  tail -1 "$build_log"
}
if [ -n "${FUZZ_TARGETS:-}" ]; then
  for t in $targets; do build "$t"; done
else
  build
fi
status=0
for t in $targets; do
  mkdir -p "corpus/$t" "artifacts/$t"
  log="artifacts/$t/run.log"
  start=$(date +%s)
  if cargo +nightly fuzz run "${profile[@]}" --fuzz-dir . -s "$sanitizer" "$t" "corpus/$t" "seeds/$t" -- \
      -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 >"$log" 2>&1; then
    result=ok
  else
    result=FAILED
    status=1
  fi
  execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}' | tail -1)
  crashes=$(ls "artifacts/$t" | grep -cE '^(crash|leak|timeout|oom)-' || true)
  echo "fuzz $t: $result, ${execs:-?} executions in $(( $(date +%s) - start )) s, $crashes crash artifacts, corpus $(ls "corpus/$t" | wc -l)"
  if [ "$result" != ok ]; then tail -40 "$log"; fi
done
exit $status

#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each one for a
# while on a copy of its seed corpus. Exits non-zero if any target finds a
# crash, a sanitizer report, a leak, a timeout or an out-of-memory; the
# reproducer is left in the build directory (crash-*, leak-*, ...).
#
#   deploy/fuzz.sh                     every target, 60 s each (predicate_fuzz
#                                      45 s, see below)
#   FUZZ_SECONDS=600 deploy/fuzz.sh    longer, every target
#   FUZZ_TARGETS="spec_fuzz" deploy/fuzz.sh
#   ASAN_BUILD_DIR=dir deploy/fuzz.sh  build somewhere else (default: build-asan,
#                                      shared with deploy/sanitize.sh asan)
#
# Prints one line per target with its executions, then the total.
set -euo pipefail
source "$(dirname "$0")/common.sh"

ms_install_packages "${MODELSTATE_PACKAGES[@]}" \
  clang-14 libclang-rt-14-dev libfuzzer-14-dev

build_dir=${ASAN_BUILD_DIR:-$MODELSTATE_ROOT/build-asan}
read -r -a targets <<<"${FUZZ_TARGETS:-safetensors_fuzz spec_fuzz stream_fuzz predicate_fuzz}"
# FUZZ_SECONDS sets every target's time. Without it predicate_fuzz (the
# attestation statement and predicate reader) gets 45 s, so that adding it
# cost CI under a minute. Measured locally from its seeds (ASan + UBSan,
# about 1100 executions a second on a loaded core): coverage 2112 edges at
# 20 s, 2200 at 40 s, 2378 at 110 s, 2403 at 215 s; nothing found.
seconds_of() {
  if [ -n "${FUZZ_SECONDS:-}" ]; then
    echo "$FUZZ_SECONDS"
  elif [ "$1" = predicate_fuzz ]; then
    echo 45
  else
    echo 60
  fi
}

# The fuzz targets live in the ASan build of deploy/sanitize.sh asan (one
# compilation of the libraries for both); after it, this builds nothing.
ms_build_asan "$build_dir"

# The build already makes UBSan findings fatal; this adds their stack.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

run_dir=$build_dir/fuzz-run
failed=()
summary=()
total=0
for target in "${targets[@]}"; do
  binary=$build_dir/tests/fuzz/$target
  seeds=$MODELSTATE_ROOT/tests/fuzz/corpus/$target
  # libFuzzer adds what it finds to the first corpus directory: a copy,
  # so that the checkout stays clean.
  corpus=$run_dir/$target/corpus
  artifacts=$run_dir/$target/
  log=$run_dir/$target/fuzz.log
  seconds=$(seconds_of "$target")
  rm -rf "${run_dir:?}/$target"
  mkdir -p "$corpus"
  cp -r "$seeds"/. "$corpus"/
  echo "[fuzz] $target: ${seconds}s, log in $log"
  status=0
  (cd "$run_dir/$target" && "$binary" "$corpus" \
     -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
     -print_final_stats=1 -artifact_prefix="$artifacts") \
    >"$log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  execs=${execs:-0}
  total=$((total + execs))
  if [ "$status" -ne 0 ]; then
    failed+=("$target")
    echo "[fuzz] $target FAILED (exit $status); the end of its log:"
    tail -n 60 "$log"
    for artifact in "$artifacts"{crash,leak,timeout,oom,slow-unit}-*; do
      if [ -e "$artifact" ]; then echo "[fuzz]   reproducer: $artifact"; fi
    done
    summary+=("$(printf '%-20s %12s executions  FAILED' "$target" "$execs")")
  else
    summary+=("$(printf '%-20s %12s executions  ok' "$target" "$execs")")
  fi
done

echo "[fuzz] summary (${FUZZ_SECONDS:-60}s per target, predicate_fuzz ${FUZZ_SECONDS:-45}s):"
for line in "${summary[@]}"; do echo "[fuzz]   $line"; done
echo "[fuzz]   $(printf '%-20s %12s executions' total "$total")"
if [ ${#failed[@]} -ne 0 ]; then
  echo "[fuzz] FAILED: ${failed[*]}"
  exit 1
fi

#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each one for a
# while on a copy of its seed corpus. Exits non-zero if any target finds a
# crash, a sanitizer report, a leak, a timeout or an out-of-memory; the
# reproducer is left in the build directory (crash-*, leak-*, ...).
#
#   deploy/fuzz.sh                     every target, 60 s each
#   FUZZ_SECONDS=600 deploy/fuzz.sh    longer
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
seconds=${FUZZ_SECONDS:-60}
read -r -a targets <<<"${FUZZ_TARGETS:-safetensors_fuzz spec_fuzz stream_fuzz predicate_fuzz}"

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

echo "[fuzz] summary (${seconds}s per target):"
for line in "${summary[@]}"; do echo "[fuzz]   $line"; done
echo "[fuzz]   $(printf '%-20s %12s executions' total "$total")"
if [ ${#failed[@]} -ne 0 ]; then
  echo "[fuzz] FAILED: ${failed[*]}"
  exit 1
fi

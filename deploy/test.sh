#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite through
# ctest, then the sanitizer runs and the fuzzers. Exits non-zero on any
# failure.
#
#   deploy/test.sh            everything (what CI runs; about 25 minutes on
#                             2 cores from a clean checkout)
#   QUICK=1 deploy/test.sh    the ctest suite only (local iteration)
#   BUILD_DIR=dir deploy/test.sh   build somewhere else (default: build)
set -euo pipefail
source "$(dirname "$0")/common.sh"

ms_install_packages "${MODELSTATE_PACKAGES[@]}"

build_dir=${BUILD_DIR:-$MODELSTATE_ROOT/build}
# Line tables (-g1) name every frame of a failure's stack at a fraction of
# full debug information's compile and link time.
ms_build "$build_dir" RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"

(cd "$build_dir" && ctest --output-on-failure -j"$(nproc)" --timeout 900)

if [ "${QUICK:-0}" = 1 ]; then
  echo "[test] QUICK=1: sanitizer and fuzz runs skipped"
  exit 0
fi
echo "[test] ASan + UBSan: the whole suite"
"$MODELSTATE_ROOT/deploy/sanitize.sh" asan
echo "[test] TSan: the concurrency and subscriber tests"
"$MODELSTATE_ROOT/deploy/sanitize.sh" tsan
echo "[test] libFuzzer: each target for ${FUZZ_SECONDS:-60} s"
"$MODELSTATE_ROOT/deploy/fuzz.sh"

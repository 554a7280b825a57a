#!/usr/bin/env bash
# Sanitizer runs of the test suite with clang 14 (deploy/test.sh runs both).
#
#   deploy/sanitize.sh asan   ASan + UBSan build of everything, whole suite
#                             (build-asan)
#   deploy/sanitize.sh tsan   TSan build of the server and the concurrency
#                             and subscriber tests, and those tests
#                             (build-tsan)
#
# Any sanitizer report fails the run: ASan/UBSan/TSan abort the process
# (halt_on_error), which fails its test.
set -euo pipefail
source "$(dirname "$0")/common.sh"

kind=${1:?usage: deploy/sanitize.sh asan|tsan}
ms_install_packages "${MODELSTATE_PACKAGES[@]}" clang-14 libclang-rt-14-dev

export CC=clang-14 CXX=clang++-14
case "$kind" in
  asan)
    dir=${ASAN_BUILD_DIR:-$MODELSTATE_ROOT/build-asan}
    # -O1 keeps the instrumented suite fast enough for CI; frame pointers
    # keep its reports readable.
    cmake -S "$MODELSTATE_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
      -DMODELSTATE_SANITIZE=address,undefined
    cmake --build "$dir" -j"$(nproc)"
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    # The benchmarks' smoke pass measures nothing under ASan; everything
    # else runs.
    (cd "$dir" && ctest --output-on-failure -j"$(nproc)" --timeout 1500 \
      -LE bench_smoke)
    ;;
  tsan)
    dir=${TSAN_BUILD_DIR:-$MODELSTATE_ROOT/build-tsan}
    cmake -S "$MODELSTATE_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DMODELSTATE_SANITIZE=thread
    # The multi-threaded parts: the store and hub in process, and the
    # server (itself built with TSan) under concurrent clients and
    # subscribers.
    targets=(modelstate-server modelstatectl rogue_subscriber
             subscriber_hub_test hooks_test module_repository_test
             service_test subscription_test access_test)
    cmake --build "$dir" -j"$(nproc)" --target "${targets[@]}"
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$MODELSTATE_ROOT/tests/tsan.supp"
    # Tests of targets not built above are listed as *_NOT_BUILT; the
    # Python and benchmark tests are not part of this run.
    (cd "$dir" && ctest --output-on-failure -j"$(nproc)" --timeout 1500 \
      -E '_NOT_BUILT$|^python_|^bench_|^deploy_files')
    ;;
  *)
    echo "usage: deploy/sanitize.sh asan|tsan" >&2
    exit 2
    ;;
esac

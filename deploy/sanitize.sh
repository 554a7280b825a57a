#!/usr/bin/env bash
# Sanitizer runs of the test suite with clang 14 (deploy/test.sh runs both).
#
#   deploy/sanitize.sh asan   ASan + UBSan build of everything, whole suite
#                             (build-asan, which holds the fuzz targets too)
#   deploy/sanitize.sh tsan   TSan build of the concurrency and subscriber
#                             tests of the core, and those tests
#                             (build-tsan)
#
# Any sanitizer report fails the run: ASan/UBSan/TSan abort the process
# (halt_on_error), which fails its test.
set -euo pipefail
source "$(dirname "$0")/common.sh"

kind=${1:?usage: deploy/sanitize.sh asan|tsan}
ms_install_packages "${MODELSTATE_PACKAGES[@]}" clang-14 libclang-rt-14-dev \
  libfuzzer-14-dev

case "$kind" in
  asan)
    dir=${ASAN_BUILD_DIR:-$MODELSTATE_ROOT/build-asan}
    ms_build_asan "$dir"
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:halt_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    # Everything runs (a sanitized build has no benchmarks).
    (cd "$dir" && ctest --output-on-failure -j"$(nproc)" --timeout 1500)
    ;;
  tsan)
    export CC=clang-14 CXX=clang++-14
    dir=${TSAN_BUILD_DIR:-$MODELSTATE_ROOT/build-tsan}
    cmake -S "$MODELSTATE_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_UNITY_BUILD=ON \
      -DMODELSTATE_SANITIZE=thread -DMODELSTATE_WITH_CUDA=OFF
    # The multi-threaded core, in process: the subscriber hub (events,
    # answers, timeouts and disconnects from many threads), the hook
    # registries, the module repository (its deletion thread) and the
    # forward kernels' parallel loops, device_test (the read-ahead
    # thread streaming device-resident state_dicts), tensor_test (the
    # thread that faults in fresh storages), shared_ring_test (a
    # producer and a consumer on one shared-memory ring) and
    # state_stream_test (a staged load's writer and observer threads
    # sharing its queue), mapped_file_test (threads catching their own bus
    # errors in a signal handler that jumps back). The tests that start the server
    # process are left out: Debian's gRPC and Abseil are not built with
    # TSan, which then reports their internal synchronisation as races and
    # defers the server's SIGTERM until its threads run instrumented code.
    targets=(subscriber_hub_test hooks_test module_repository_test merkle_test
             forward_test device_test tensor_test shared_ring_test
             state_stream_test mapped_file_test)
    cmake --build "$dir" -j"$(nproc)" --target "${targets[@]}"
    # Ignore the intercepted calls (memcpy, epoll, ...) that uninstrumented
    # libraries make themselves, one entry per library the tests load;
    # races in modelstate's own code are still reported.
    supp=$dir/tsan.supp
    for target in "${targets[@]}"; do ldd "$dir/tests/$target"; done \
      | awk '{print $1}' \
      | grep -E '^lib(grpc|gpr|absl_|protobuf|re2|upb|address_sorting|openblas)' \
      | sort -u | sed 's/^/called_from_lib:/' >"$supp"
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp"
    for target in "${targets[@]}"; do
      echo "[tsan] $target"
      "$dir/tests/$target" --gtest_brief=1
    done
    ;;
  *)
    echo "usage: deploy/sanitize.sh asan|tsan" >&2
    exit 2
    ;;
esac

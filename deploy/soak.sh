#!/usr/bin/env bash
# The long soak: tests/server/soak_test.cc for SOAK_SECONDS (default 300)
# against the server binary of BUILD_DIR (default build), which it builds
# first. Not part of deploy/test.sh, whose ctest runs the 8-second form.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$BUILD_DIR" -j"$(nproc)" --target soak_test modelstate-server
SOAK_SECONDS="${SOAK_SECONDS:-300}" "$BUILD_DIR/tests/soak_test"

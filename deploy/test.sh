#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite through
# ctest. Exits non-zero on any failure.
#
#   deploy/test.sh            the full suite (what CI runs)
#   BUILD_DIR=dir deploy/test.sh   build somewhere else (default: build)
set -euo pipefail
source "$(dirname "$0")/common.sh"

ms_install_packages "${MODELSTATE_PACKAGES[@]}"

build_dir=${BUILD_DIR:-$MODELSTATE_ROOT/build}
ms_build "$build_dir" RelWithDebInfo

cd "$build_dir"
ctest --output-on-failure -j"$(nproc)" --timeout 900

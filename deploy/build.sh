#!/usr/bin/env bash
# Installs what is missing and builds modelstate-server and modelstatectl
# (Release, no tests). The Dockerfile's build stage runs this, so an image is
# built with the same package list and the same cmake steps (common.sh) that
# deploy/test.sh, and so CI, use.
#
#   deploy/build.sh BUILD_DIR         install, then build into BUILD_DIR
#   deploy/build.sh --packages-only   install only (a cacheable image layer)
#
# The binaries end up in BUILD_DIR/server/modelstate-server and
# BUILD_DIR/client/modelstatectl.
set -euo pipefail
source "$(dirname "$0")/common.sh"

if [ $# -ne 1 ]; then
  echo "usage: $0 BUILD_DIR | --packages-only" >&2
  exit 2
fi

ms_install_packages "${MODELSTATE_RUNTIME_BUILD_PACKAGES[@]}"
if [ "$1" = "--packages-only" ]; then
  exit 0
fi

ms_build "$1" Release -DMODELSTATE_BUILD_TESTS=OFF

#!/usr/bin/env bash
# Installs what is missing, builds (Release) and runs modelstate-server in the
# foreground on 127.0.0.1:50051 with the data directory ./data.
#
#   deploy/run.sh                    as above
#   deploy/run.sh --listen=127.0.0.1:6000 --data_dir=/srv/modelstate
#                                    extra flags go to the server
#   BUILD_DIR=dir deploy/run.sh      build somewhere else (default: build-release)
set -euo pipefail
source "$(dirname "$0")/common.sh"

ms_install_packages "${MODELSTATE_RUNTIME_BUILD_PACKAGES[@]}"

build_dir=${BUILD_DIR:-$MODELSTATE_ROOT/build-release}
ms_build "$build_dir" Release -DMODELSTATE_BUILD_TESTS=OFF

exec "$build_dir/server/modelstate-server" \
  --listen=127.0.0.1:50051 --data_dir=./data "$@"

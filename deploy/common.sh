# Shared helpers for deploy/*.sh. Source it; do not run it.
# Installs Debian 12 packages that are missing (as root, non-interactive) and
# configures + builds the project.

MODELSTATE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Packages that building the server and the CLI needs.
MODELSTATE_RUNTIME_BUILD_PACKAGES=(
  g++ cmake make pkg-config git ca-certificates
  libabsl-dev libgrpc++-dev libprotobuf-dev protobuf-compiler
  protobuf-compiler-grpc grpc-proto libssl-dev libopenblas-dev
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
)
# ... plus what the whole test suite needs.
MODELSTATE_PACKAGES=(
  "${MODELSTATE_RUNTIME_BUILD_PACKAGES[@]}"
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-grpcio python3-protobuf python3-numpy python3-torch python3-yaml
  # The Python client's install test (venv + pip, Debian's setuptools and
  # wheel, no network) and its progress bars.
  python3-pip python3-venv python3-setuptools python3-wheel python3-tqdm
  openssl
  golang-go golang-golang-x-mod-dev
  # promtool checks the metrics and alert rules; a real Prometheus scrapes
  # a test server (tests/ops/).
  prometheus
)

# ms_install_packages PKG...: installs whichever of PKG are not installed.
ms_install_packages() {
  local missing=()
  local pkg
  for pkg in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null \
        | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "[deploy] installing: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# ms_build BUILD_DIR BUILD_TYPE [extra cmake args...]: configures and builds.
ms_build() {
  local dir=$1 type=$2
  shift 2
  cmake -S "$MODELSTATE_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE="$type" "$@"
  cmake --build "$dir" -j"$(nproc)"
}

# Shared helpers for deploy/*.sh. Source it; do not run it.
# Installs Debian 12 packages that are missing (as root, non-interactive) and
# configures + builds the project.

MODELSTATE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Packages that building the server and the CLI needs.
MODELSTATE_RUNTIME_BUILD_PACKAGES=(
  g++ cmake make pkg-config git ca-certificates
  libabsl-dev libgrpc++-dev libprotobuf-dev protobuf-compiler
  protobuf-compiler-grpc grpc-proto libssl-dev libopenblas-dev
  nlohmann-json3-dev libcli11-dev libcpp-httplib-dev libsqlite3-dev
)
# ... plus what the whole test suite needs.
MODELSTATE_PACKAGES=(
  "${MODELSTATE_RUNTIME_BUILD_PACKAGES[@]}"
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-grpcio python3-protobuf python3-numpy python3-torch python3-yaml
  # The Python client's install test (venv + pip, Debian's setuptools and
  # wheel, no network) and its progress bars.
  python3-pip python3-venv python3-setuptools python3-wheel python3-tqdm
  openssl python3-cryptography
  golang-go golang-golang-x-mod-dev
  # promtool checks the metrics and alert rules; a real Prometheus scrapes
  # a test server (tests/ops/).
  prometheus
  # A real etcd for the cluster tests (tests/cluster/).
  etcd-server etcd-client
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
# Unity builds compile each library's sources as a few large files: the
# heavy gRPC, protobuf and Abseil headers are parsed once per batch instead
# of once per source, about a third less compile time on a 2-core machine.
ms_build() {
  local dir=$1 type=$2
  shift 2
  cmake -S "$MODELSTATE_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE="$type" \
    -DCMAKE_UNITY_BUILD=ON "$@"
  cmake --build "$dir" -j"$(nproc)"
}

# ms_build_asan BUILD_DIR: the clang ASan + UBSan build that runs the whole
# suite (deploy/sanitize.sh asan) and the libFuzzer targets (deploy/fuzz.sh),
# both from one compilation. -O1 keeps the instrumented suite fast enough
# for CI; line tables (-g1) are all a sanitizer report needs; frame
# pointers keep its stacks readable.
ms_build_asan() {
  CC=clang-14 CXX=clang++-14 ms_build "$1" RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DMODELSTATE_SANITIZE=address,undefined -DMODELSTATE_FUZZ=ON \
    -DMODELSTATE_WITH_CUDA=OFF
}

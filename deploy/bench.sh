#!/usr/bin/env bash
# Runs every benchmark and writes BENCHMARKS.md: each figure a ratio against a
# baseline measured in the same run (raw gRPC, PyTorch 1.13, memcpy / F16C).
#
#   deploy/bench.sh          installs what is missing, builds Release in
#                            build-bench, runs everything (about 15 minutes
#                            on 2 cores) and rewrites BENCHMARKS.md
#   deploy/bench.sh --smoke BUILD_DIR OUT.md
#                            tiny sizes with the binaries already built in
#                            BUILD_DIR; the test suite runs this so that the
#                            benchmarks and this script never rot
#   deploy/bench.sh --built BUILD_DIR
#                            full sizes with the binaries already built in
#                            BUILD_DIR (an optimised build: the report names
#                            its build type and flags); rewrites BENCHMARKS.md
set -euo pipefail
source "$(dirname "$0")/common.sh"

smoke=0
if [ "${1:-}" = "--smoke" ]; then
  smoke=1
  build_dir=$2
  report=$3
elif [ "${1:-}" = "--built" ]; then
  build_dir=$(cd "$2" && pwd)
  report=$MODELSTATE_ROOT/BENCHMARKS.md
else
  ms_install_packages "${MODELSTATE_PACKAGES[@]}"
  build_dir=${BENCH_BUILD_DIR:-$MODELSTATE_ROOT/build-bench}
  report=$MODELSTATE_ROOT/BENCHMARKS.md
  # A unity build, as deploy/run.sh's: the benchmarks measure what runs.
  cmake -S "$MODELSTATE_ROOT" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_UNITY_BUILD=ON
  cmake --build "$build_dir" -j"$(nproc)" --target modelstate-server \
    modelstatectl core_bench transfer_bench dump_state_dict forward_bench \
    audit_bench
  if grep -q "^MODELSTATE_WITH_CUDA:BOOL=ON" "$build_dir/CMakeCache.txt"; then
    cmake --build "$build_dir" -j"$(nproc)" --target cuda_bench
  fi
fi

bench=$MODELSTATE_ROOT/tests/bench
models=$bench/models
# A smoke run (the test suite's) keeps apart from a full run's results, which
# stay to regenerate the report from.
results=$build_dir/bench-results$([ $smoke = 1 ] && echo -smoke || true)
mkdir -p "$results"
# Debian's interpreter: the one with torch 1.13, grpcio and numpy.
python=/usr/bin/python3

if [ $smoke = 1 ]; then
  core_args=(--smoke --benchmark_min_time=0.01 --benchmark_repetitions=2)
  torch_args=(--smoke --reps 2 --warmup 0)
  transfer_args=(--smoke --reps 2 --warmup 0)
  python_transfer_args=(--smoke --reps 2 --warmup 0)
  torch_model=mlp
  forward_args=(--smoke --benchmark_min_time=0.01 --benchmark_repetitions=2)
  torch_forward_args=(--smoke --reps 2 --warmup 0)
  audit_args=(--smoke)
  cluster_args=(--smoke)
  growth_args=(--smoke)
else
  core_args=(--benchmark_repetitions=5)
  torch_args=(--reps 5 --warmup 1 --models gpt2,resnet50)
  transfer_args=(--reps 9 --warmup 2)
  python_transfer_args=(--mib 600 --reps 5 --warmup 1)
  torch_model=gpt2
  forward_args=(--benchmark_repetitions=5)
  torch_forward_args=(--reps 5 --warmup 1)
  cluster_args=(--mib 256 --reps 5 --warmup 1)
  # Up to 4 GiB hosted, plus its file on tmpfs and the load's staging.
  growth_args=(--reps 3 --warmup 1)
  # 10^7 records: about 3 GB of log, tree and index in $TMPDIR.
  audit_args=(--records=10000000 --seconds=10 --reps=3)
fi

echo "[bench] the benchmark models build what PyTorch builds"
"$python" "$bench/check_models.py" "$build_dir/tests/dump_state_dict" \
  "$models" $([ $smoke = 1 ] && echo "--models mlp") \
  | tee "$results/check_models.txt"

echo "[bench] core (1 thread) against memcpy and the F16C loop"
"$build_dir/tests/bench/core_bench" --models="$models" "${core_args[@]}" \
  --benchmark_enable_random_interleaving=true \
  --benchmark_report_aggregates_only=true \
  --benchmark_out="$results/core.json" --benchmark_out_format=json

echo "[bench] PyTorch, same models, same thread count (1)"
"$python" "$bench/torch_bench.py" --threads 1 "${torch_args[@]}" \
  --out "$results/torch.json"

echo "[bench] modelstate-server against a raw gRPC service; a restart with 1 GiB"
echo "[bench] hosted (smoke: 8 MiB) against reading its data files"
echo "[bench] AttestModule and SignStateFile (smoke: mlp) against 1-thread SHA-256"
"$build_dir/tests/bench/transfer_bench" \
  --server="$build_dir/server/modelstate-server" --models="$models" \
  "${transfer_args[@]}" --out="$results/transfer.json" >/dev/null

echo "[bench] the Python client against the C++ client (modelstatectl), same module"
"$python" "$bench/python_transfer_bench.py" \
  --server="$build_dir/server/modelstate-server" \
  --cli="$build_dir/client/modelstatectl" "${python_transfer_args[@]}" \
  --out "$results/python_transfer.json"

echo "[bench] forward against raw sgemm and PyTorch (2 threads each)"
"$build_dir/tests/bench/forward_bench" --threads=2 "${forward_args[@]}" \
  --benchmark_enable_random_interleaving=true \
  --benchmark_report_aggregates_only=true \
  --benchmark_out="$results/forward.json" --benchmark_out_format=json
"$python" "$bench/torch_forward_bench.py" --threads 2 \
  "${torch_forward_args[@]}" --out "$results/torch_forward.json"

echo "[bench] the audit log: appends against a plain file, proofs, restarts"
"$build_dir/tests/bench/audit_bench" "${audit_args[@]}" \
  --out="$results/audit.json" >/dev/null

# Needs Debian's etcd-server (deploy/common.sh installs it).
echo "[bench] a cluster on etcd: calls forwarded by another replica against direct"
"$python" "$bench/cluster_bench.py" \
  --server="$build_dir/server/modelstate-server" \
  --cli="$build_dir/client/modelstatectl" "${cluster_args[@]}" \
  --out "$results/cluster.json"

echo "[bench] how transfer time grows with state size and entry count"
"$python" "$bench/growth_bench.py" \
  --server="$build_dir/server/modelstate-server" \
  --cli="$build_dir/client/modelstatectl" "${growth_args[@]}" \
  --out "$results/growth.json"

# Only in a CUDA build; without a GPU it measures nothing and says so.
cuda_report=()
if [ -x "$build_dir/tests/bench/cuda_bench" ]; then
  echo "[bench] CUDA transfers against raw pinned cudaMemcpy"
  rm -f "$results/cuda.json"
  "$build_dir/tests/bench/cuda_bench" $([ $smoke = 1 ] && echo --smoke) \
    --benchmark_repetitions=$([ $smoke = 1 ] && echo 2 || echo 5) \
    --benchmark_report_aggregates_only=true \
    --benchmark_out="$results/cuda.json" --benchmark_out_format=json
fi
if [ -s "$results/cuda.json" ]; then
  cuda_report=(--cuda "$results/cuda.json")
elif [ -f "$bench/gpu-results/cuda_bench.json" ]; then
  # No GPU here: the CUDA section shows the figures last measured on a GPU
  # host, committed with the code that produced them (the section names
  # the GPU and the date).
  cuda_report=(--cuda "$bench/gpu-results/cuda_bench.json")
fi

{
  echo "Checks run with these figures:"
  echo
  echo "- the benchmark models build bit for bit what PyTorch builds:"
  echo "  \`$(tail -n 1 "$results/check_models.txt")\`"
  type=$(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build_dir/CMakeCache.txt")
  flags=$(sed -n "s/^CMAKE_CXX_FLAGS_$(echo "$type" | tr a-z A-Z):STRING=//p" \
    "$build_dir/CMakeCache.txt")
  echo "- built as: $type ($flags)"
} >"$results/checks.md"

"$python" "$bench/make_report.py" --core "$results/core.json" \
  --torch "$results/torch.json" --transfer "$results/transfer.json" \
  --forward "$results/forward.json" \
  --torch-forward "$results/torch_forward.json" \
  --python-transfer "$results/python_transfer.json" \
  --audit "$results/audit.json" --cluster "$results/cluster.json" \
  --growth "$results/growth.json" \
  --torch-model "$torch_model" --checks "$results/checks.md" \
  "${cuda_report[@]}" --out "$report"
echo "[bench] wrote $report"

// Forward benchmarks (Google Benchmark), each beside its baseline in the
// same run:
//  - Linear forward at batch 256 (1024 -> 1024 and 768 -> 3072) against a
//    bare cblas_sgemm of the same shapes (GFLOP/s counters for both), so the
//    overhead of the module call (hooks check, output allocation, bias) is
//    visible;
//  - a GPT-2-small block: TransformerEncoderLayer(768, 12, 3072, gelu,
//    norm_first, batch_first) in eval mode on 1 x 1024 tokens with a causal
//    mask (GPT-2's block is pre-norm; its GELU is the tanh approximation,
//    TransformerEncoderLayer's is exact). torch_forward_bench.py times the
//    same block in PyTorch;
//  - the same block with its weights mapped from a data file, as a server
//    hosts them after a restart or with --map_saved_bytes (page-cache pages
//    rather than the huge pages of its own storages), against the block
//    with its weights in memory.
//
//   forward_bench [--smoke] [--threads=N] [Google Benchmark flags]
//
// --threads sets OpenBLAS's threads (and the kernels' own) for both sides;
// 0 (the default) keeps OpenBLAS's default (all cores).
#include <cblas.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/mapped_file.h"
#include "benchmark/benchmark.h"
#include "core/module.h"
#include "nn/forward.h"
#include "nn/module_spec.h"

namespace modelstate::bench {
namespace {

bool g_smoke = false;
int g_threads = 0;

template <typename T>
T Check(absl::StatusOr<T> value, const std::string& what) {
  if (!value.ok()) {
    std::cerr << "forward_bench: " << what << ": " << value.status() << "\n";
    std::exit(1);
  }
  return *std::move(value);
}

std::shared_ptr<Module> BuildLayer(ModuleSpec spec) {
  BuildOptions options;
  options.hooks = nullptr;
  std::shared_ptr<Module> m =
      Check(BuildModule(spec, options), "build " + spec.type).root;
  m->Eval();
  return m;
}

Tensor Random(Shape shape, uint64_t seed) {
  Tensor t = Check(Tensor::Empty(DType::kFloat32, shape), "input");
  void* data = Check(t.MutableDataForOverwrite(), "input");
  Generator gen(seed);
  gen.FillUniform(DType::kFloat32, data, t.numel(), -1.0, 1.0);
  return t;
}

ForwardOptions Options() {
  ForwardOptions options;
  options.num_threads = g_threads;
  return options;
}

int64_t Batch() { return g_smoke ? 8 : 256; }
int64_t Scale(int64_t features) { return g_smoke ? features / 16 : features; }

void SetFlops(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iteration * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

void BM_LinearForward(benchmark::State& state) {
  const int64_t in = Scale(state.range(0)), out = Scale(state.range(1));
  std::shared_ptr<Module> m =
      BuildLayer(ModuleSpec::Layer("Linear", {in, out}));
  Tensor x = Random({Batch(), in}, 1);
  ForwardOptions options = Options();
  for (auto _ : state) {
    std::vector<Tensor> y = Check(Forward(*m, {x}, options), "forward");
    benchmark::DoNotOptimize(y[0].raw_data());
  }
  SetFlops(state, 2.0 * Batch() * in * out);
}
BENCHMARK(BM_LinearForward)
    ->Args({1024, 1024})
    ->Args({768, 3072})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The same product as Linear's (x * W^T into a preallocated output), with
// no bias, allocation or dispatch.
void BM_RawSgemm(benchmark::State& state) {
  const int64_t in = Scale(state.range(0)), out = Scale(state.range(1));
  const int64_t batch = Batch();
  if (g_threads > 0) openblas_set_num_threads(g_threads);
  Tensor x = Random({batch, in}, 1);
  Tensor w = Random({out, in}, 2);
  std::vector<float> y(static_cast<size_t>(batch * out));
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out, in, 1.0f,
                x.data<float>(), in, w.data<float>(), in, 0.0f, y.data(), out);
    benchmark::DoNotOptimize(y.data());
  }
  SetFlops(state, 2.0 * batch * in * out);
}
BENCHMARK(BM_RawSgemm)
    ->Args({1024, 1024})
    ->Args({768, 3072})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Writes every tensor of `m` to one file (64-byte aligned, as the server's
// data files align them), maps it, and switches the tensors to views of it.
void MapWeightsFromAFile(Module& m) {
  const std::string path =
      absl::StrCat(getenv("TMPDIR") != nullptr ? getenv("TMPDIR") : "/tmp",
                   "/forward_bench_weights.", getpid());
  StateDict sd = m.GetStateDict("", /*keep_vars=*/true);
  std::vector<size_t> offsets;
  {
    std::ofstream out(path, std::ios::binary);
    size_t offset = 0;
    for (const auto& item : sd.tensors) {
      offset = (offset + 63) / 64 * 64;
      out.seekp(static_cast<std::streamoff>(offset));
      out.write(static_cast<const char*>(item.value.raw_data()),
                static_cast<std::streamsize>(item.value.nbytes()));
      offsets.push_back(offset);
      offset += item.value.nbytes();
    }
  }
  std::shared_ptr<const MappedFile> file =
      Check(MappedFile::Open(path), "map " + path);
  unlink(path.c_str());  // The mapping outlives the name.
  size_t i = 0;
  for (const auto& item : sd.tensors) {
    Tensor t = item.value;
    std::shared_ptr<Storage> view =
        Storage::MapSavedBytes(*t.storage(), file, offsets[i++], 0, path);
    t.SetData(Check(Tensor::FromStorage(t.dtype(), t.shape(), view), "view"));
  }
  for (const auto& item : m.GetStateDict("", /*keep_vars=*/true).tensors) {
    if (!item.value.storage()->read_only()) {
      std::cerr << "forward_bench: " << item.key << " is not mapped\n";
      std::exit(1);
    }
  }
}

// The GPT-2-small block, its weights in memory or (`mapped`) mapped from a
// file written with them, as ModuleRepository hosts saved bytes.
void Gpt2Block(benchmark::State& state, bool mapped) {
  const int64_t d = g_smoke ? 64 : 768, heads = g_smoke ? 4 : 12, ffn = 4 * d,
                seq = g_smoke ? 16 : 1024;
  ModuleSpec spec = ModuleSpec::Layer("TransformerEncoderLayer", {d, heads},
                                      {{"dim_feedforward", ffn},
                                       {"activation", std::string("gelu")},
                                       {"batch_first", true},
                                       {"norm_first", true}});
  std::shared_ptr<Module> m = BuildLayer(spec);
  if (mapped) MapWeightsFromAFile(*m);
  Tensor x = Random({1, seq, d}, 3);
  std::vector<double> causal(static_cast<size_t>(seq * seq), 0.0);
  for (int64_t i = 0; i < seq; ++i) {
    for (int64_t j = i + 1; j < seq; ++j) {
      causal[i * seq + j] = -std::numeric_limits<double>::infinity();
    }
  }
  Tensor mask =
      Check(Tensor::FromDoubles(DType::kFloat32, {seq, seq}, causal), "mask");
  ForwardOptions options = Options();
  for (auto _ : state) {
    std::vector<Tensor> y = Check(Forward(*m, {x, mask}, options), "forward");
    benchmark::DoNotOptimize(y[0].raw_data());
  }
  // Projections and MLP (2 * 12 d^2 per token) plus the two attention
  // products (2 * 2 * seq * d per token).
  SetFlops(state, 2.0 * seq * (12.0 * d * d) + 4.0 * seq * seq * d);
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(seq), benchmark::Counter::kIsIterationInvariantRate);
}
void BM_Gpt2Block(benchmark::State& state) { Gpt2Block(state, false); }
void BM_Gpt2BlockMappedWeights(benchmark::State& state) {
  Gpt2Block(state, true);
}
BENCHMARK(BM_Gpt2Block)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Gpt2BlockMappedWeights)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace modelstate::bench

int main(int argc, char** argv) {
  // Our flags first; the rest go to Google Benchmark.
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--smoke") {
      modelstate::bench::g_smoke = true;
    } else if (absl::StartsWith(arg, "--threads=")) {
      if (!absl::SimpleAtoi(arg.substr(10), &modelstate::bench::g_threads)) {
        std::cerr << "forward_bench: bad " << arg << "\n";
        return 1;
      }
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// Core benchmarks (Google Benchmark), each beside its baseline in the same
// run: building the GPT-2 shape with PyTorch's default init (the PyTorch
// side is torch_bench.py), load_state_dict's copy against memcpy of the same
// bytes, to(float16) against the bare F16C conversion loop over the same
// elements, CRC-32C (the data directory's checksum) three instruction
// chains at once against one, and a 10^12-parameter spec built on the meta
// device.
//
//   core_bench --models=DIR [--smoke] [Google Benchmark flags]
//
// Everything runs on one thread, as the core does.
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "benchmark/benchmark.h"
#include "core/dtype.h"
#include "core/module.h"
#include "google/protobuf/util/json_util.h"
#include "modelstate/v1/module.pb.h"
#include "nn/module_spec.h"
#include "proto/service_convert.h"
#include "tests/testing/proc_status.h"

namespace modelstate::bench {
namespace {

std::string g_models_dir;
bool g_smoke = false;

template <typename T>
T Check(absl::StatusOr<T> value, const std::string& what) {
  if (!value.ok()) {
    std::cerr << "core_bench: " << what << ": " << value.status() << "\n";
    std::exit(1);
  }
  return *std::move(value);
}

ModuleSpec LoadSpec(const std::string& model) {
  std::string path = g_models_dir + "/" + model + ".json";
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  v1::ModuleSpec proto;
  auto parsed = google::protobuf::util::JsonStringToMessage(text, &proto);
  if (text.empty() || !parsed.ok()) {
    std::cerr << "core_bench: cannot read " << path << "\n";
    std::exit(1);
  }
  return Check(convert::SpecFromProto(proto), path);
}

// The model of the construct / load / to() benchmarks.
const ModuleSpec& BigModel() {
  static const ModuleSpec* spec =
      new ModuleSpec(LoadSpec(g_smoke ? "mlp" : "gpt2"));
  return *spec;
}

std::shared_ptr<Module> Build(const ModuleSpec& spec, uint64_t seed,
                              Device device = Device::Cpu()) {
  BuildOptions options;
  options.seed = seed;
  options.hooks = nullptr;
  options.device = device;

  return Check(BuildModule(spec, options), "build").root;
}

// --- construct -------------------------------------------------------------

void BM_ConstructDefaultInit(benchmark::State& state) {
  const ModuleSpec& spec = BigModel();
  uint64_t params = 0;
  for (auto _ : state) {
    std::shared_ptr<Module> m = Build(spec, 0);
    state.PauseTiming();  // freeing is not construction (nor in torch_bench)
    params = 0;
    for (const auto& [key, t] : m->NamedParameters()) params += t.numel();
    m.reset();
    state.ResumeTiming();
  }
  state.counters["params"] = static_cast<double>(params);
}
BENCHMARK(BM_ConstructDefaultInit)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// --- load_state_dict (copy) against memcpy -------------------------------

void BM_LoadStateDictCopy(benchmark::State& state) {
  std::shared_ptr<Module> target = Build(BigModel(), 0);
  const StateDict source = Build(BigModel(), 1)->GetStateDict();
  uint64_t bytes = 0;
  for (const auto& item : source.tensors) bytes += item.value.nbytes();
  for (auto _ : state) {
    absl::StatusOr<LoadResult> result = target->LoadStateDict(source);
    if (!result.ok()) state.SkipWithError("load failed");
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes * state.iterations()));
}
BENCHMARK(BM_LoadStateDictCopy)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same bytes, tensor by tensor, from the same kind of buffers into
// already mapped destinations.
void BM_MemcpyBaseline(benchmark::State& state) {
  const StateDict source = Build(BigModel(), 1)->GetStateDict();
  StateDict target = Build(BigModel(), 0)->GetStateDict();
  std::vector<std::pair<const void*, void*>> pairs;
  std::vector<size_t> sizes;
  uint64_t bytes = 0;
  for (const auto& item : source.tensors) {
    Tensor& t = *target.tensors.Find(item.key);
    pairs.emplace_back(item.value.raw_data(),
                       Check(t.MutableDataForOverwrite(), "target"));
    sizes.push_back(item.value.nbytes());
    bytes += item.value.nbytes();
  }
  for (auto _ : state) {
    for (size_t i = 0; i < pairs.size(); ++i) {
      std::memcpy(pairs[i].second, pairs[i].first, sizes[i]);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes * state.iterations()));
}
BENCHMARK(BM_MemcpyBaseline)->Unit(benchmark::kMillisecond)->UseRealTime();

// --- to(float16) against the F16C loop -----------------------------------

void BM_ToFloat16(benchmark::State& state) {
  int64_t elements = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::shared_ptr<Module> m = Build(BigModel(), 0);  // a fresh fp32 model
    elements = 0;
    for (const auto& [key, t] : m->NamedParameters()) elements += t.numel();
    state.ResumeTiming();
    if (!m->To(std::nullopt, DType::kFloat16).ok()) {
      state.SkipWithError("to() failed");
    }
    state.PauseTiming();
    m.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(elements * state.iterations());
}
BENCHMARK(BM_ToFloat16)->Unit(benchmark::kMillisecond)->UseRealTime();

// The conversion kernel alone over the same elements, tensor by tensor,
// into already mapped float16 buffers.
void BM_F16cLoopBaseline(benchmark::State& state) {
  std::shared_ptr<Module> m = Build(BigModel(), 0);
  std::vector<Tensor> sources;
  std::vector<Tensor> targets;
  int64_t elements = 0;
  for (const auto& [key, t] : m->NamedParameters()) {
    sources.push_back(t);
    Tensor out = Check(Tensor::Zeros(DType::kFloat16, t.shape()), "alloc");
    targets.push_back(out);
    elements += t.numel();
  }
  std::vector<void*> outs;
  for (Tensor& t : targets) {
    outs.push_back(Check(t.MutableDataForOverwrite(), "target"));
  }
  for (auto _ : state) {
    for (size_t i = 0; i < sources.size(); ++i) {
      ConvertElements(sources[i].raw_data(), DType::kFloat32, outs[i],
                      DType::kFloat16, sources[i].numel());
    }
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(elements * state.iterations());
}
BENCHMARK(BM_F16cLoopBaseline)->Unit(benchmark::kMillisecond)->UseRealTime();

// --- CRC-32C: three instruction chains against one -----------------------

// Over 1 MiB (a piece just received, in cache) and 256 MiB (a stored
// tensor read from memory; 16 MiB in smoke runs).
int64_t CrcBytes(const benchmark::State& state) {
  return state.range(0) == 0 ? int64_t{1} << 20
                             : (g_smoke ? int64_t{16} : int64_t{256}) << 20;
}

template <uint32_t (*Crc)(uint32_t, absl::string_view)>
void RunCrc(benchmark::State& state) {
  std::string bytes(static_cast<size_t>(CrcBytes(state)), '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>(i * 131 + (i >> 11));
  }
  uint32_t crc = 0;
  for (auto _ : state) {
    crc = Crc(crc, bytes);
    benchmark::DoNotOptimize(crc);
  }
  state.SetBytesProcessed(CrcBytes(state) * state.iterations());
}

void BM_Crc32c(benchmark::State& state) { RunCrc<Crc32cExtend>(state); }
BENCHMARK(BM_Crc32c)->Arg(0)->Arg(1)->UseRealTime();

void BM_Crc32cOneChainBaseline(benchmark::State& state) {
  RunCrc<internal::Crc32cExtendOneStream>(state);
}
BENCHMARK(BM_Crc32cOneChainBaseline)->Arg(0)->Arg(1)->UseRealTime();

// --- 10^12 parameters on meta ----------------------------------------------

// 1000 x Linear(31623, 31623): 1.0000e12 parameters (10^6 in smoke runs).
ModuleSpec TrillionSpec() {
  const int64_t width = g_smoke ? 1000 : 31623;
  ModuleSpec spec;
  spec.type = "Sequential";
  for (int i = 0; i < (g_smoke ? 1 : 1000); ++i) {
    ModuleSpec layer;
    layer.type = "Linear";
    layer.args = {SpecValue(int64_t{width}), SpecValue(int64_t{width})};
    spec.children.push_back(ModuleChild{"", std::move(layer)});
  }
  return spec;
}

void BM_MetaTrillion(benchmark::State& state) {
  const ModuleSpec spec = TrillionSpec();
  // Peak RSS of this benchmark alone.
  std::ofstream("/proc/self/clear_refs") << "5";
  const uint64_t before = testing::ProcStatusBytes(0, "VmHWM");
  double params = 0;
  for (auto _ : state) {
    std::shared_ptr<Module> m = Build(spec, 0, Device::Meta());
    state.PauseTiming();
    params = 0;
    for (const auto& [key, t] : m->NamedParameters()) {
      params += static_cast<double>(t.numel());
    }
    m.reset();
    state.ResumeTiming();
  }
  state.counters["params"] = params;
  state.counters["peak_rss_mib"] =
      static_cast<double>(testing::ProcStatusBytes(0, "VmHWM")) / (1 << 20);
  state.counters["rss_before_mib"] = static_cast<double>(before) / (1 << 20);
}
BENCHMARK(BM_MetaTrillion)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace modelstate::bench

int main(int argc, char** argv) {
  // Our flags first; the rest go to Google Benchmark.
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (absl::StartsWith(arg, "--models=")) {
      modelstate::bench::g_models_dir = arg.substr(9);
    } else if (arg == "--smoke") {
      modelstate::bench::g_smoke = true;
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

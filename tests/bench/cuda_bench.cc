// CUDA transfer benchmarks against raw CUDA baselines, in the same run:
//   BM_RawPinnedH2D / BM_RawPinnedD2H: cudaMemcpy from/to pinned host memory
//     (the baseline: what the PCIe link gives);
//   BM_ToH2D / BM_ToD2H: Tensor::To between cpu and cuda:0, same bytes
//     (pageable host tensor, through the backend's pinned staging);
//   BM_PinThenCopyH2D: the alternative to staging, pinning the pageable
//     buffer for the copy (cudaHostRegister, cudaMemcpy, unregister);
//   BM_NewHostTensor: a new host tensor of the same bytes, written once (the
//     page faults that a download into a new tensor pays on top);
//   BM_StagedUpload|Download/threads:N: the backend's staged copies alone,
//     between a pageable host buffer already faulted in and cuda:0, with at
//     most N staging threads (how the CPU side scales);
//   BM_StreamStateDict/cpu|cuda: a state_dict of the same tensors read as
//     GetStateDict does (StateDictReader, 1 MiB chunks), from cpu and from
//     cuda:0.
// Without a GPU it says so and runs nothing (exit 0): CI builds and runs the
// smoke pass everywhere.
//
//   cuda_bench [--smoke] [Google Benchmark flags]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "core/cuda/cuda_backend.h"
#include "core/device.h"
#include "core/module.h"
#include "core/state_stream.h"
#include "core/storage.h"
#include "core/tensor.h"

namespace modelstate::bench {
namespace {

bool g_smoke = false;

size_t Bytes() { return g_smoke ? size_t{8} << 20 : size_t{512} << 20; }

Tensor HostTensor(size_t nbytes) {
  std::string bytes(nbytes, '\0');
  for (size_t i = 0; i < nbytes; i += 4096) bytes[i] = static_cast<char>(i);
  return *Tensor::FromBytes(DType::kFloat32, {static_cast<int64_t>(nbytes / 4)},
                            std::move(bytes));
}

void SetBytes(benchmark::State& state, size_t nbytes) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(nbytes));
}

// cudaMemcpy of Bytes() between pinned host memory and the device.
void BM_RawPinnedCopy(benchmark::State& state, cudaMemcpyKind kind) {
  const size_t n = Bytes();
  void* host = nullptr;
  void* device = nullptr;
  if (cudaMallocHost(&host, n) != cudaSuccess ||
      cudaMalloc(&device, n) != cudaSuccess) {
    state.SkipWithError("cannot allocate");
    return;
  }
  std::memset(host, 1, n);
  cudaMemset(device, 1, n);
  const bool upload = kind == cudaMemcpyHostToDevice;
  for (auto _ : state) {
    cudaMemcpy(upload ? device : host, upload ? host : device, n, kind);
  }
  SetBytes(state, n);
  cudaFree(device);
  cudaFreeHost(host);
}

void BM_ToH2D(benchmark::State& state) {
  const Tensor host = HostTensor(Bytes());
  for (auto _ : state) {
    absl::StatusOr<Tensor> gpu = host.To(Device::Cuda(0), DType::kFloat32);
    if (!gpu.ok()) state.SkipWithError(gpu.status().ToString().c_str());
    benchmark::DoNotOptimize(gpu);
  }
  SetBytes(state, host.nbytes());
}

void BM_ToD2H(benchmark::State& state) {
  absl::StatusOr<Tensor> gpu =
      HostTensor(Bytes()).To(Device::Cuda(0), DType::kFloat32);
  if (!gpu.ok()) {
    state.SkipWithError(gpu.status().ToString().c_str());
    return;
  }
  for (auto _ : state) {
    absl::StatusOr<Tensor> host = gpu->To(Device::Cpu(), DType::kFloat32);
    benchmark::DoNotOptimize(host);
  }
  SetBytes(state, gpu->nbytes());
}

// Bytes() through a backend of at most `threads` staging threads, between a
// pageable host buffer (faulted in beforehand) and cuda:0.
void BM_Staged(benchmark::State& state, bool upload, int threads) {
  const std::unique_ptr<modelstate::DeviceBackend> backend =
      modelstate::cuda::MakeCudaBackend(threads);
  const size_t n = Bytes();
  std::string host(n, '\1');
  absl::StatusOr<void*> device = backend->Allocate(0, n);
  if (!device.ok()) {
    state.SkipWithError(device.status().ToString().c_str());
    return;
  }
  for (auto _ : state) {
    const absl::Status status =
        upload ? backend->Upload(
                     0, *device, n,
                     [&](void* staging, size_t offset, size_t length) {
                       std::memcpy(staging, host.data() + offset, length);
                     })
               : backend->Download(
                     0, *device, n,
                     [&](const void* staging, size_t offset, size_t length) {
                       std::memcpy(host.data() + offset, staging, length);
                     });
    if (!status.ok()) state.SkipWithError(status.ToString().c_str());
  }
  SetBytes(state, n);
  backend->Free(0, *device);
}

void BM_PinThenCopyH2D(benchmark::State& state) {
  const size_t n = Bytes();
  std::string host(n, '\1');
  void* device = nullptr;
  if (cudaMalloc(&device, n) != cudaSuccess) {
    state.SkipWithError("cannot allocate");
    return;
  }
  for (auto _ : state) {
    if (cudaHostRegister(host.data(), n, cudaHostRegisterDefault) !=
            cudaSuccess ||
        cudaMemcpy(device, host.data(), n, cudaMemcpyHostToDevice) !=
            cudaSuccess ||
        cudaHostUnregister(host.data()) != cudaSuccess) {
      state.SkipWithError("cudaHostRegister path failed");
      break;
    }
  }
  SetBytes(state, n);
  cudaFree(device);
}

void BM_NewHostTensor(benchmark::State& state) {
  const size_t n = Bytes();
  for (auto _ : state) {
    absl::StatusOr<Tensor> t = Tensor::Empty(
        DType::kFloat32, {static_cast<int64_t>(n / 4)}, Device::Cpu());
    absl::StatusOr<void*> data =
        t.ok() ? t->MutableDataForOverwrite() : absl::StatusOr<void*>(nullptr);
    if (!data.ok() || *data == nullptr) {
      state.SkipWithError("cannot allocate");
      break;
    }
    std::memset(*data, 1, n);
    benchmark::DoNotOptimize(*data);
  }
  SetBytes(state, n);
}

// 16 tensors of Bytes() / 16 on `device`, streamed in 1 MiB chunks.
void BM_StreamStateDict(benchmark::State& state, Device device) {
  StateDict sd;
  const size_t each = Bytes() / 16;
  for (int i = 0; i < 16; ++i) {
    absl::StatusOr<Tensor> t = HostTensor(each).To(device, DType::kFloat32);
    if (!t.ok()) {
      state.SkipWithError(t.status().ToString().c_str());
      return;
    }
    sd.tensors.Set(absl::StrCat("layer", i, ".weight"), *std::move(t));
  }
  std::string chunk;
  for (auto _ : state) {
    std::unique_ptr<StateDictReader> reader =
        *StateDictReader::Create(sd, std::nullopt);
    while (true) {
      chunk.clear();
      absl::StatusOr<size_t> n = reader->Read(1 << 20, &chunk);
      if (!n.ok() || *n == 0) break;
      benchmark::DoNotOptimize(chunk.data());
    }
  }
  SetBytes(state, each * 16);
}

}  // namespace
}  // namespace modelstate::bench

int main(int argc, char** argv) {
  using namespace modelstate::bench;  // NOLINT: a benchmark's main
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--smoke") {
      g_smoke = true;
    } else {
      rest.push_back(argv[i]);
    }
  }
  const modelstate::DeviceBackend* cuda =
      modelstate::FindDeviceBackend(modelstate::DeviceType::kCuda);
  if (cuda == nullptr || cuda->DeviceCount() == 0) {
    std::printf("cuda_bench: no GPU visible (%s); nothing to measure\n",
                cuda == nullptr ? "built without CUDA"
                                : cuda->UnavailableReason().c_str());
    return 0;
  }
  int driver = 0;
  cudaDriverGetVersion(&driver);
  benchmark::AddCustomContext("gpu", cuda->DeviceName(0));
  benchmark::AddCustomContext(
      "cuda_driver", absl::StrCat(driver / 1000, ".", driver % 1000 / 10));
  benchmark::RegisterBenchmark("BM_RawPinnedH2D", BM_RawPinnedCopy,
                               cudaMemcpyHostToDevice)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_ToH2D", BM_ToH2D)->UseRealTime();
  benchmark::RegisterBenchmark("BM_RawPinnedD2H", BM_RawPinnedCopy,
                               cudaMemcpyDeviceToHost)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_ToD2H", BM_ToD2H)->UseRealTime();
  benchmark::RegisterBenchmark("BM_PinThenCopyH2D", BM_PinThenCopyH2D)
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_NewHostTensor", BM_NewHostTensor)
      ->UseRealTime();
  for (int threads : {1, 2, 4, 8, 16}) {
    for (bool upload : {true, false}) {
      benchmark::RegisterBenchmark(
          absl::StrCat(upload ? "BM_StagedUpload" : "BM_StagedDownload",
                       "/threads:", threads)
              .c_str(),
          BM_Staged, upload, threads)
          ->UseRealTime();
    }
  }
  benchmark::RegisterBenchmark("BM_StreamStateDict/cpu", BM_StreamStateDict,
                               modelstate::Device::Cpu())
      ->UseRealTime();
  benchmark::RegisterBenchmark("BM_StreamStateDict/cuda", BM_StreamStateDict,
                               modelstate::Device::Cuda(0))
      ->UseRealTime();
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

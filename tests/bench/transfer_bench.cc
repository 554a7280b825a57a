// The service benchmarks, each next to its baseline measured in the same
// run: state_dict transfers against raw gRPC moving the same bytes in the
// same chunks (and the server's peak RSS meanwhile), a ResNet-50 build
// through remote interceptors against a bare ping-pong, 32 concurrent
// clients against one client fetching as much in a row, a restart with
// 1 GiB hosted against reading its data files, and AttestModule (every
// tensor hashed on 2 threads, then signed) and SignStateFile (the state as
// one file, hashed on one thread) against one thread of OpenSSL SHA-256
// over the same bytes in this process. modelstate-server and the raw gRPC
// server run as separate processes on loopback; this process is the client of
// both.
//
//   transfer_bench --server=PATH --models=DIR --out=results.json
//                  [--reps=5] [--warmup=1] [--clients=32] [--smoke]
//
// Writes JSON: every figure's samples and median (seconds, microseconds
// or bytes, as named).
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/malloc_settings.h"
#include "base/sha256.h"
#include "client/model_state_client.h"
#include "client/subscriber.h"
#include "core/storage.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "raw_grpc.h"
#include "tests/testing/proc_status.h"
#include "tests/testing/server_process.h"

ABSL_FLAG(std::string, server, "", "modelstate-server binary");
ABSL_FLAG(std::string, models, "", "directory of the benchmark model specs");
ABSL_FLAG(std::string, out, "transfer_bench.json", "where the JSON goes");
ABSL_FLAG(int, reps, 5, "measured repetitions of each figure");
ABSL_FLAG(int, warmup, 1, "unmeasured repetitions first");
ABSL_FLAG(int, clients, 32, "concurrency: how many clients fetch at once");
ABSL_FLAG(bool, smoke, false, "tiny models and counts (for the test suite)");
ABSL_FLAG(std::vector<std::string>, figures,
          std::vector<std::string>({"transfer", "hooks", "concurrency",
                                    "restore", "attest", "shared_memory",
                                    "mapped", "idle_latency"}),
          "which figures to measure");
ABSL_FLAG(bool, reuse_message_memory, false,
          "this process (the clients) takes the server's malloc settings "
          "(base/malloc_settings.h), as README recommends for a process "
          "that runs many transfers at once");
// The raw gRPC server mode (this binary, started by itself).
ABSL_FLAG(bool, serve_raw, false,
          "serve the raw gRPC baseline and nothing else");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "raw server: address");
ABSL_FLAG(std::string, ready_file, "",
          "raw server: where to write the address");

namespace modelstate::bench {
namespace {

using Json = nlohmann::json;
using client::ModelStateClient;
using testing::ProcessCpuSeconds;
using testing::ProcStatusBytes;

constexpr uint32_t kChunk = 1 << 20;

[[noreturn]] void Fail(const std::string& what, const absl::Status& status) {
  std::cerr << "transfer_bench: " << what << ": " << status << "\n";
  std::exit(1);
}

template <typename T>
T Check(absl::StatusOr<T> value, const std::string& what) {
  if (!value.ok()) Fail(what, value.status());
  return *std::move(value);
}

void Check(const absl::Status& status, const std::string& what) {
  if (!status.ok()) Fail(what, status);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

Json Figure(const std::vector<double>& samples) {
  return Json{{"median", Median(samples)}, {"samples", samples}};
}

// The last `n` of `samples`: those of the measured repetitions, when the
// warmup's were collected too.
std::vector<double> Last(const std::vector<double>& samples, size_t n) {
  return std::vector<double>(
      samples.end() - static_cast<ptrdiff_t>(std::min(n, samples.size())),
      samples.end());
}

// The cores this process may run on (its affinity), which a cgroup's CPU
// quota may still cut.
int CoresAvailable() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return static_cast<int>(std::thread::hardware_concurrency());
  }
  return CPU_COUNT(&set);
}

// Runs `once` warmup + reps times; returns the measured results.
template <typename Fn>
std::vector<double> Repeat(Fn once) {
  std::vector<double> samples;
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int reps = absl::GetFlag(FLAGS_reps);
  for (int i = 0; i < warmup + reps; ++i) {
    double value = once();
    if (i >= warmup) samples.push_back(value);
  }
  return samples;
}

// Runs `baseline` and `measured` alternately, warmup + reps times each, so
// that both see the same moments of a noisy machine; returns their results.
template <typename A, typename B>
std::pair<std::vector<double>, std::vector<double>> RepeatPair(A baseline,
                                                               B measured) {
  std::vector<double> a;
  std::vector<double> b;
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int reps = absl::GetFlag(FLAGS_reps);
  for (int i = 0; i < warmup + reps; ++i) {
    double x = baseline();
    double y = measured();
    if (i >= warmup) {
      a.push_back(x);
      b.push_back(y);
    }
  }
  return {a, b};
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// The least a durable load of `bytes` costs on the data directory's disk:
// one new file written in `chunk`-sized pieces, its writeback started every
// 32 MiB so that the disk works while the writes go on, then fdatasync
// (what a LoadStateDict must have done before it answers). Returns the
// seconds.
double RawDurableWrite(const std::filesystem::path& dir, uint64_t bytes,
                       uint32_t chunk) {
  const std::string path = (dir / "raw-durable-write.bin").string();
  const std::string piece(chunk, '\x5a');
  auto start = std::chrono::steady_clock::now();
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) Fail(path, absl::ErrnoToStatus(errno, "open"));
  constexpr uint64_t kWriteback = 32 << 20;
  uint64_t written_back = 0;
  for (uint64_t done = 0; done < bytes;) {
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(chunk, bytes - done));
    Check(WriteAll(fd, absl::string_view(piece.data(), n), path), "write");
    done += n;
    if (done - written_back >= kWriteback) {
      sync_file_range(fd, static_cast<off64_t>(written_back),
                      static_cast<off64_t>(done - written_back),
                      SYNC_FILE_RANGE_WRITE);
      written_back = done;
    }
  }
  Check(Fdatasync(fd, path), "fdatasync");
  const double seconds = Seconds(start);
  close(fd);
  unlink(path.c_str());
  return seconds;
}

// `count` x Linear(1024, 1024) in a Sequential: 4 MiB each.
// `count` x Linear(1024, out_features).
v1::ModuleSpec LinearStack(int count, int out_features = 1024) {
  v1::ModuleSpec spec;
  spec.set_type("Sequential");
  for (int i = 0; i < count; ++i) {
    v1::ModuleSpec* layer = spec.add_children()->mutable_spec();
    layer->set_type("Linear");
    layer->add_args()->set_number_value(1024);
    layer->add_args()->set_number_value(out_features);
  }
  return spec;
}

v1::ModuleSpec LoadSpec(const std::string& model) {
  if (model == "linear16") return LinearStack(16);
  std::string path = absl::GetFlag(FLAGS_models) + "/" + model + ".json";
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  if (text.empty()) Fail(path, absl::NotFoundError("cannot read it"));
  v1::ModuleSpec spec;
  auto status = google::protobuf::util::JsonStringToMessage(text, &spec);
  if (!status.ok()) Fail(path, absl::InvalidArgumentError(status.ToString()));
  return spec;
}

v1::BuildModuleResponse Build(ModelStateClient& client, const std::string& name,
                              const v1::ModuleSpec& spec) {
  v1::BuildModuleRequest request;
  request.set_module(name);
  *request.mutable_spec() = spec;
  return Check(client.BuildModule(request), "build " + name);
}

// A client on a connection of its own (gRPC would otherwise share one TCP
// connection among channels to the same address).
// Its transfers use gRPC messages unless `shared_memory`; its other calls
// have `timeout` as their deadline.
std::unique_ptr<ModelStateClient> OwnConnection(
    const std::string& address, bool shared_memory = false,
    absl::Duration timeout = client::ClientOptions().timeout,
    client::ClientOptions options = {}) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  options.shared_memory = shared_memory;
  options.timeout = timeout;
  return std::make_unique<ModelStateClient>(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                args),
      options);
}

// Receives a state_dict and keeps nothing: the same client-side work as
// the raw download, which only counts bytes.
class CountingSink : public client::StateDictSink {
 public:
  absl::Status Begin(const StateDictLayout&) override {
    return absl::OkStatus();
  }
  absl::Status Append(absl::string_view bytes) override {
    bytes_ += bytes.size();
    return absl::OkStatus();
  }
  absl::Status Finish() override { return absl::OkStatus(); }
  uint64_t bytes() const { return bytes_; }

 private:
  uint64_t bytes_ = 0;
};

// /proc/<pid>/status fields, in bytes.
// Resets the process's peak RSS (VmHWM) to its current RSS.
void ResetPeakRss(pid_t pid) {
  std::ofstream(absl::StrCat("/proc/", pid, "/clear_refs")) << "5";
}

struct Servers {
  testing::ServerProcess modelstate;
  testing::ServerProcess raw;
  std::unique_ptr<ModelStateClient> client;
  std::unique_ptr<RawClient> raw_client;
};

Json TransferFigures(Servers& s, const std::string& model) {
  Build(*s.client, "bench/transfer", LoadSpec(model));
  v1::GetModuleRequest describe;
  describe.set_module("bench/transfer");
  const uint64_t hosted =
      Check(s.client->GetModule(describe), "describe").total_bytes();
  const StateDict state =
      Check(s.client->GetStateDict("bench/transfer"), "fetch");
  uint64_t bytes = 0;
  for (const auto& item : state.tensors) bytes += item.value.nbytes();
  const pid_t pid = s.modelstate.pid();
  const uint64_t base_rss = ProcStatusBytes(pid, "VmRSS");

  uint64_t get_peak = 0;
  auto [raw_down, get] = RepeatPair(
      [&] { return Check(s.raw_client->Download(bytes, kChunk), "raw down"); },
      [&] {
        ResetPeakRss(pid);
        client::GetStateDictOptions options;
        options.chunk_bytes = kChunk;
        CountingSink sink;
        auto start = std::chrono::steady_clock::now();
        Check(s.client->GetStateDict("bench/transfer", options, sink), "get");
        double seconds = Seconds(start);
        if (sink.bytes() != bytes) Fail("get", absl::DataLossError("short"));
        get_peak = std::max(get_peak, ProcStatusBytes(pid, "VmHWM"));
        return seconds;
      });
  uint64_t load_peak = 0;
  // The CPU each load takes, in the server and in this client: on a machine
  // of few cores, their sum over the cores bounds the load as well.
  std::vector<double> load_server_cpu;
  std::vector<double> load_client_cpu;
  // The durable write runs beside the raw upload, so that all three see the
  // same moments of the machine; the load's target is the slower of them.
  std::vector<double> raw_durable;
  auto [raw_up, load] = RepeatPair(
      [&] {
        raw_durable.push_back(
            RawDurableWrite(s.modelstate.data_dir(), bytes, kChunk));
        return Check(s.raw_client->Upload(bytes, kChunk), "raw up");
      },
      [&] {
        ResetPeakRss(pid);
        client::LoadStateDictOptions options;
        options.chunk_bytes = kChunk;
        const double server_cpu = ProcessCpuSeconds(pid);
        const double client_cpu = ProcessCpuSeconds(0);
        auto start = std::chrono::steady_clock::now();
        Check(
            s.client->LoadStateDict("bench/transfer", state, options).status(),
            "load");
        double seconds = Seconds(start);
        load_server_cpu.push_back(ProcessCpuSeconds(pid) - server_cpu);
        load_client_cpu.push_back(ProcessCpuSeconds(0) - client_cpu);
        load_peak = std::max(load_peak, ProcStatusBytes(pid, "VmHWM"));
        return seconds;
      });
  Check(s.client->DeleteModule("bench/transfer"), "delete");
  return Json{{"model", model},
              {"bytes", bytes},
              {"chunk_bytes", kChunk},
              {"hosted_bytes", hosted},
              {"server_rss_before_bytes", base_rss},
              {"raw_download_s", Figure(raw_down)},
              {"get_state_dict_s", Figure(get)},
              {"raw_upload_s", Figure(raw_up)},
              {"raw_durable_write_s", Figure(Last(raw_durable, raw_up.size()))},
              {"load_state_dict_s", Figure(load)},
              {"load_server_cpu_s", Figure(Last(load_server_cpu, load.size()))},
              {"load_client_cpu_s", Figure(Last(load_client_cpu, load.size()))},
              {"cores", CoresAvailable()},
              {"server_peak_rss_get_bytes", get_peak},
              {"server_peak_rss_load_bytes", load_peak}};
}

// The same-host path: GetStateDict into a StateDict through the shared
// memory ring against a memcpy of the same bytes into fresh memory (what
// any receive into new tensors costs at least) and into memory already
// faulted in, and against the same fetch as gRPC messages; a fetch into
// tensors the client already has (a replica refreshed in place) against
// memcpy into memory already faulted in; LoadStateDict both ways.
Json SharedMemoryFigures(Servers& s, const std::string& model) {
  Build(*s.client, "bench/shm", LoadSpec(model));
  const std::unique_ptr<ModelStateClient> shared =
      OwnConnection(s.modelstate.address(), /*shared_memory=*/true);
  const StateDict state = Check(s.client->GetStateDict("bench/shm"), "fetch");
  uint64_t bytes = 0;
  for (const auto& item : state.tensors) bytes += item.value.nbytes();
  const std::string source(bytes, '\x5a');
  std::string warm(bytes, '\0');
  auto [memcpy_fresh, get_shared] = RepeatPair(
      [&] {
        auto start = std::chrono::steady_clock::now();
        auto fresh = Check(Storage::Allocate(bytes, Device::Cpu()), "alloc");
        std::memcpy(fresh->data(), source.data(), bytes);
        return Seconds(start);
      },
      [&] {
        auto start = std::chrono::steady_clock::now();
        StateDict got = Check(shared->GetStateDict("bench/shm"), "get shm");
        return Seconds(start);
      });
  auto memcpy_into_warm = [&] {
    auto start = std::chrono::steady_clock::now();
    std::memcpy(warm.data(), source.data(), bytes);
    return Seconds(start);
  };
  auto [memcpy_warm, get_grpc] = RepeatPair(memcpy_into_warm, [&] {
    auto start = std::chrono::steady_clock::now();
    StateDict got = Check(s.client->GetStateDict("bench/shm"), "get grpc");
    return Seconds(start);
  });
  StateDict replica = Check(shared->GetStateDict("bench/shm"), "fetch replica");
  auto [memcpy_warm_beside_into, get_into] = RepeatPair(memcpy_into_warm, [&] {
    auto start = std::chrono::steady_clock::now();
    Check(shared->GetStateDictInto("bench/shm", replica), "get into");
    return Seconds(start);
  });
  // Whether the server wrote the bytes in itself (direct table) or they
  // came through the slots (the kernel refused): the report says which.
  class PlacedCountingSink : public client::MemorySink {
   public:
    using MemorySink::MemorySink;
    absl::Status Placed(uint64_t n) override {
      placed += n;
      return MemorySink::Placed(n);
    }
    uint64_t placed = 0;
  } placed_sink, placed_into_sink(&replica);
  Check(shared->GetStateDict("bench/shm", {}, placed_sink), "get placed");
  Check(shared->GetStateDict("bench/shm", {}, placed_into_sink),
        "get into placed");
  // The ring's slots alone (no direct table): two copies, the second while
  // the first goes on.
  client::ClientOptions slots_only;
  slots_only.shared_memory_direct = false;
  const std::unique_ptr<ModelStateClient> slots =
      OwnConnection(s.modelstate.address(), /*shared_memory=*/true,
                    client::ClientOptions().timeout, slots_only);
  const std::vector<double> get_slots = Repeat([&] {
    auto start = std::chrono::steady_clock::now();
    StateDict got = Check(slots->GetStateDict("bench/shm"), "get slots");
    return Seconds(start);
  });
  auto [load_grpc, load_shared] = RepeatPair(
      [&] {
        auto start = std::chrono::steady_clock::now();
        Check(s.client->LoadStateDict("bench/shm", state).status(), "load");
        return Seconds(start);
      },
      [&] {
        auto start = std::chrono::steady_clock::now();
        Check(shared->LoadStateDict("bench/shm", state).status(), "load shm");
        return Seconds(start);
      });
  Check(s.client->DeleteModule("bench/shm"), "delete");
  return Json{{"model", model},
              {"bytes", bytes},
              {"memcpy_fresh_s", Figure(memcpy_fresh)},
              {"memcpy_warm_s", Figure(memcpy_warm)},
              {"get_shared_s", Figure(get_shared)},
              {"get_slots_s", Figure(get_slots)},
              {"direct_placed_bytes", placed_sink.placed},
              {"get_into_s", Figure(get_into)},
              {"memcpy_warm_beside_into_s", Figure(memcpy_warm_beside_into)},
              {"into_placed_bytes", placed_into_sink.placed},
              {"get_grpc_s", Figure(get_grpc)},
              {"load_shared_s", Figure(load_shared)},
              {"load_grpc_s", Figure(load_grpc)}};
}

// Small fetches, each after an idle gap drawn from 0 to 300 ms (the same
// draws every run), against the same fetches back to back: how long a call
// takes when the server has been idle, which a server whose pollers sleep
// when idle gets wrong (server/async_calls.h). Percentiles, in seconds.
Json IdleLatencyFigures(Servers& s, int calls) {
  Build(*s.client, "bench/idle", LoadSpec("mlp"));
  std::mt19937 draws(20261129);
  std::uniform_int_distribution<int> gap_ms(0, 300);
  auto fetches = [&](bool idle) {
    std::vector<double> seconds;
    for (int i = 0; i < calls; ++i) {
      if (idle) {
        std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms(draws)));
      }
      auto start = std::chrono::steady_clock::now();
      Check(s.client->GetStateDict("bench/idle").status(), "idle fetch");
      seconds.push_back(Seconds(start));
    }
    std::sort(seconds.begin(), seconds.end());
    auto percentile = [&](double p) {
      return seconds[std::min(seconds.size() - 1,
                              static_cast<size_t>(p * seconds.size()))];
    };
    return Json{{"p50_s", percentile(0.5)},
                {"p90_s", percentile(0.9)},
                {"p99_s", percentile(0.99)},
                {"max_s", seconds.back()}};
  };
  Json back_to_back = fetches(false);
  Json idle = fetches(true);
  Check(s.client->DeleteModule("bench/idle"), "delete");
  return Json{{"calls", calls}, {"back_to_back", back_to_back}, {"idle", idle}};
}

// The attestation RPCs of a hosted model against hashing its bytes here on
// one thread, with nothing else (the least any digest of it costs).
Json AttestFigures(Servers& s, const std::string& model) {
  Build(*s.client, "bench/attest", LoadSpec(model));
  const StateDict state = Check(s.client->GetStateDict("bench/attest"), "get");
  uint64_t bytes = 0;
  for (const auto& item : state.tensors) bytes += item.value.nbytes();
  std::string sink;  // keeps the digests from being optimised away
  auto [sha, attest] = RepeatPair(
      [&] {
        auto start = std::chrono::steady_clock::now();
        for (const auto& item : state.tensors) {
          sink = Sha256Hex(
              absl::string_view(static_cast<const char*>(item.value.raw_data()),
                                item.value.nbytes()));
        }
        return Seconds(start);
      },
      [&] {
        auto start = std::chrono::steady_clock::now();
        Check(s.client->AttestModule("bench/attest").status(), "attest");
        return Seconds(start);
      });
  std::vector<double> sign = Repeat([&] {
    auto start = std::chrono::steady_clock::now();
    Check(s.client->SignStateFile("bench/attest", {}, "model.safetensors")
              .status(),
          "sign state file");
    return Seconds(start);
  });
  Check(s.client->DeleteModule("bench/attest"), "delete");
  return Json{{"model", model},
              {"bytes", bytes},
              {"sha256_1thread_s", Figure(sha)},
              {"attest_s", Figure(attest)},
              {"sign_state_file_s", Figure(sign)}};
}

Json PingPongFigures(Servers& s, int count) {
  std::vector<double> rtt =
      Check(s.raw_client->PingPong(count, count / 10), "ping-pong");
  std::sort(rtt.begin(), rtt.end());
  return Json{{"count", count},
              {"p50_us", Median(rtt)},
              {"p99_us", rtt[rtt.size() * 99 / 100]}};
}

// Builds `model` with `interceptors` remote subscribers approving every
// registration, each on its own connection.
Json HookFigures(Servers& s, const std::string& model, double ping_p50_us) {
  const v1::ModuleSpec spec = LoadSpec(model);
  Json out{{"model", model}};
  int registrations = 0;
  int round = 0;
  Build(*s.client, "bench/hooks-size", spec);
  v1::GetModuleRequest describe;
  describe.set_module("bench/hooks-size");
  const uint64_t bytes =
      Check(s.client->GetModule(describe), "describe").total_bytes();
  Check(s.client->DeleteModule("bench/hooks-size"), "delete");
  out["bytes"] = bytes;
  out["cores"] = CoresAvailable();
  for (int interceptors : {0, 1, 4}) {
    std::vector<std::unique_ptr<ModelStateClient>> clients;
    std::vector<std::unique_ptr<client::Subscriber>> subscribers;
    for (int i = 0; i < interceptors; ++i) {
      clients.push_back(OwnConnection(s.modelstate.address()));
      v1::Subscription subscription;
      subscription.set_name(absl::StrCat("approver-", i));
      subscription.set_priority(i);
      subscribers.push_back(Check(
          client::Subscriber::Start(*clients.back(), subscription,
                                    [](const v1::HookEventProto& event) {
                                      v1::HookAnswer answer;
                                      answer.set_event_id(event.event_id());
                                      answer.set_verdict(
                                          v1::HookAnswer::APPROVE);
                                      return answer;
                                    }),
          "subscribe"));
    }
    std::vector<double> server_cpu;
    auto build = [&] {
      std::string name = absl::StrCat("bench/hooks", round++);
      const double cpu = ProcessCpuSeconds(s.modelstate.pid());
      auto start = std::chrono::steady_clock::now();
      v1::BuildModuleResponse built = Build(*s.client, name, spec);
      double t = Seconds(start);
      server_cpu.push_back(ProcessCpuSeconds(s.modelstate.pid()) - cpu);
      registrations = built.registrations_size();
      Check(s.client->DeleteModule(name), "delete");
      return t;
    };
    std::vector<double> seconds;
    if (interceptors == 0) {
      // A build's durable half, its bytes written and synced as a build
      // must before it answers (the target adds PyTorch's construction to
      // it), alternates with the builds: both see the same moments of the
      // disk, whose speed swings.
      std::vector<double> raw;
      std::tie(raw, seconds) = RepeatPair(
          [&] {
            return RawDurableWrite(s.modelstate.data_dir(), bytes, kChunk);
          },
          build);
      out["raw_durable_write_s"] = Figure(raw);
      out["build_0_server_cpu_s"] = Figure(Last(server_cpu, seconds.size()));
    } else {
      seconds = Repeat(build);
    }
    for (auto& sub : subscribers) sub->Stop();
    out[absl::StrCat("build_", interceptors, "_interceptors_s")] =
        Figure(seconds);
  }
  out["registrations"] = registrations;
  out["sequential_estimate_s"] = registrations * ping_p50_us * 1e-6;
  return out;
}

// `clients` connections fetch the module at once, against one connection
// fetching it `clients` times in a row: the same bytes, so that the two
// figures span the same stretch of a noisy machine, alternated. Also the
// CPU per fetch of the server and of this process (where the clients run).
Json ConcurrencyFigures(Servers& s, const std::string& model, int clients) {
  Build(*s.client, "bench/shared", LoadSpec(model));
  std::vector<std::unique_ptr<ModelStateClient>> connections;
  for (int i = 0; i < clients; ++i) {
    connections.push_back(OwnConnection(s.modelstate.address()));
  }
  // The size comes from the single client's fetches only: a failed
  // concurrent fetch must show as an error, not as a size of zero.
  uint64_t bytes = 0;
  auto fetch = [&](ModelStateClient& c, uint64_t* received) -> absl::Status {
    client::GetStateDictOptions options;
    options.chunk_bytes = kChunk;
    CountingSink sink;
    absl::Status status = c.GetStateDict("bench/shared", options, sink);
    if (received != nullptr) *received = sink.bytes();
    return status;
  };
  const pid_t pid = s.modelstate.pid();
  // Runs `fetches`; the seconds and CPU seconds of each kind per fetch.
  struct PerFetch {
    std::vector<double> seconds, server_cpu, client_cpu;
  };
  auto timed = [&](PerFetch& out, auto fetches) {
    const double server_cpu = ProcessCpuSeconds(pid);
    const double client_cpu = ProcessCpuSeconds(0);
    auto start = std::chrono::steady_clock::now();
    fetches();
    const double seconds = Seconds(start);
    out.seconds.push_back(seconds / clients);
    out.server_cpu.push_back((ProcessCpuSeconds(pid) - server_cpu) / clients);
    out.client_cpu.push_back((ProcessCpuSeconds(0) - client_cpu) / clients);
    return seconds;
  };
  PerFetch one, all;
  int errors = 0;
  std::string first_error;
  const std::vector<double> together =
      RepeatPair(
          [&] {
            return timed(one, [&] {
              for (int i = 0; i < clients; ++i) {
                Check(fetch(*connections[0], &bytes), "single fetch");
              }
            });
          },
          [&] {
            std::vector<absl::Status> results(clients);
            const double seconds = timed(all, [&] {
              std::vector<std::thread> threads;
              for (int i = 0; i < clients; ++i) {
                threads.emplace_back(
                    [&, i] { results[i] = fetch(*connections[i], nullptr); });
              }
              for (auto& t : threads) t.join();
            });
            for (const absl::Status& r : results) {
              if (r.ok()) continue;
              std::cerr << "transfer_bench: a concurrent fetch failed: " << r
                        << "\n";
              if (errors++ == 0) first_error = r.ToString();
            }
            return seconds;
          })
          .second;
  Check(s.client->DeleteModule("bench/shared"), "delete");
  const size_t reps = together.size();
  return Json{
      {"model", model},
      {"bytes_per_client", bytes},
      {"clients", clients},
      // One fetch's share of the single client's run.
      {"single_client_s", Figure(Last(one.seconds, reps))},
      {"all_clients_s", Figure(together)},
      {"single_server_cpu_s", Figure(Last(one.server_cpu, reps))},
      {"single_client_cpu_s", Figure(Last(one.client_cpu, reps))},
      {"all_server_cpu_per_fetch_s", Figure(Last(all.server_cpu, reps))},
      {"all_client_cpu_per_fetch_s", Figure(Last(all.client_cpu, reps))},
      {"cores", CoresAvailable()},
      {"errors", errors},
      {"first_error", first_error}};
}

// Reads every file under `dir` once (the bytes a restore must read and
// checksum); returns the bytes read.
uint64_t ReadEveryFile(const std::filesystem::path& dir) {
  std::vector<char> buffer(4 << 20);
  uint64_t total = 0;
  for (const auto& item : std::filesystem::recursive_directory_iterator(dir)) {
    if (!item.is_regular_file()) continue;
    std::ifstream in(item.path(), std::ios::binary);
    while (in.read(buffer.data(), buffer.size()) || in.gcount() > 0) {
      total += static_cast<uint64_t>(in.gcount());
    }
  }
  return total;
}

// How long a restarted server takes until it serves (start to the ready
// file), with one module of `count` Linear layers of `out_features` x 1024
// float32 hosted. `read_files`: also time reading every data file once, as
// the baseline of what a restart that reads its bytes would cost (both from
// the page cache: the figure is the server's own work, not the disk's).
Json RestartFigures(const std::string& server, int count, int out_features,
                    bool read_files) {
  testing::ServerProcess own(server, {});
  Check(own.Start(), "start the restore server");
  if (count > 0) {
    // Building and saving 8 GiB takes minutes on a small machine.
    std::unique_ptr<ModelStateClient> client =
        OwnConnection(own.address(), false, absl::Minutes(30));
    Build(*client, "bench/restore", LinearStack(count, out_features));
  }  // an idle connection would hold the server's shutdown
  own.Stop(SIGTERM);
  const std::filesystem::path modules = own.data_dir() / "modules";
  auto restart = [&] {
    auto start = std::chrono::steady_clock::now();
    Check(own.Start(), "restart");
    double seconds = Seconds(start);
    own.Stop(SIGTERM);
    return seconds;
  };
  Json out{
      {"layers", count},
      // Each Linear: weight and bias, float32.
      {"hosted_bytes", static_cast<uint64_t>(count) * out_features * 1025 * 4}};
  if (read_files) {
    uint64_t file_bytes = 0;
    auto [read, restarted] = RepeatPair(
        [&] {
          auto start = std::chrono::steady_clock::now();
          file_bytes = ReadEveryFile(modules);
          return Seconds(start);
        },
        restart);
    out["file_bytes"] = file_bytes;
    out["read_files_s"] = Figure(read);
    out["restart_s"] = Figure(restarted);
  } else {
    out["restart_s"] = Figure(Repeat(restart));
  }
  return out;
}

// What --map_saved_bytes costs the calls that write hosted tensors: the
// same durable LoadStateDict, to(float16) and back, and GetStateDict on a
// server that hosts its saved bytes from the data files, against one that
// keeps them in memory (both started here, the module built on each). A
// write into a mapped tensor gets fresh memory where one in memory is
// overwritten in place; reads come from the page cache.
Json MappedFigures(const std::string& server, const std::string& model) {
  testing::ServerProcess mapped(server, {"--map_saved_bytes"});
  testing::ServerProcess memory(server, {});
  Check(mapped.Start(), "start the --map_saved_bytes server");
  Check(memory.Start(), "start the in-memory server");
  const std::unique_ptr<ModelStateClient> on_file =
      OwnConnection(mapped.address());
  const std::unique_ptr<ModelStateClient> in_memory =
      OwnConnection(memory.address());
  const v1::ModuleSpec spec = LoadSpec(model);
  for (ModelStateClient* c : {on_file.get(), in_memory.get()}) {
    Build(*c, "bench/mapped", spec);
  }
  const StateDict state =
      Check(in_memory->GetStateDict("bench/mapped"), "fetch");
  uint64_t bytes = 0;
  for (const auto& item : state.tensors) bytes += item.value.nbytes();
  auto load = [&](ModelStateClient& c) {
    auto start = std::chrono::steady_clock::now();
    Check(c.LoadStateDict("bench/mapped", state).status(), "load");
    return Seconds(start);
  };
  auto half_and_back = [&](ModelStateClient& c) {
    v1::MoveModuleRequest move;
    move.set_module("bench/mapped");
    auto start = std::chrono::steady_clock::now();
    move.set_dtype("float16");
    Check(c.MoveModule(move).status(), "to(float16)");
    move.set_dtype("float32");
    Check(c.MoveModule(move).status(), "to(float32)");
    return Seconds(start);
  };
  auto get = [&](ModelStateClient& c) {
    auto start = std::chrono::steady_clock::now();
    StateDict got = Check(c.GetStateDict("bench/mapped"), "get");
    return Seconds(start);
  };
  auto [load_memory, load_mapped] = RepeatPair([&] { return load(*in_memory); },
                                               [&] { return load(*on_file); });
  auto [move_memory, move_mapped] =
      RepeatPair([&] { return half_and_back(*in_memory); },
                 [&] { return half_and_back(*on_file); });
  auto [get_memory, get_mapped] = RepeatPair([&] { return get(*in_memory); },
                                             [&] { return get(*on_file); });
  return Json{{"model", model},
              {"bytes", bytes},
              {"load_memory_s", Figure(load_memory)},
              {"load_mapped_s", Figure(load_mapped)},
              {"half_and_back_memory_s", Figure(move_memory)},
              {"half_and_back_mapped_s", Figure(move_mapped)},
              {"get_memory_s", Figure(get_memory)},
              {"get_mapped_s", Figure(get_mapped)}};
}

// Restarts with 1 GiB and with 8 GiB hosted, in the same number of tensors
// (so the same manifest work), and with nothing hosted: with the data files
// mapped instead of read, the bytes hosted should not show.
Json RestoreFigures(const std::string& server, bool smoke) {
  const int layers = smoke ? 2 : 256;
  Json out = RestartFigures(server, layers, 1024, /*read_files=*/true);
  out["empty"] = RestartFigures(server, 0, 1024, false);
  out["eight_times"] = RestartFigures(server, layers, 8 * 1024, false);
  return out;
}

int Run() {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe");
  const bool smoke = absl::GetFlag(FLAGS_smoke);
  Servers s{testing::ServerProcess(absl::GetFlag(FLAGS_server), {}),
            testing::ServerProcess(self, {"--serve_raw"}, /*data_dir=*/false),
            nullptr, nullptr};
  Check(s.modelstate.Start(), "start modelstate-server");
  Check(s.raw.Start(), "start the raw gRPC server");
  s.client = OwnConnection(s.modelstate.address());
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(64 << 20);
  s.raw_client = std::make_unique<RawClient>(grpc::CreateCustomChannel(
      s.raw.address(), grpc::InsecureChannelCredentials(), args));

  Json out;
  auto wanted = [](const std::string& figure) {
    const std::vector<std::string> all = absl::GetFlag(FLAGS_figures);
    return std::find(all.begin(), all.end(), figure) != all.end();
  };
  if (wanted("transfer")) {
    out["transfer"] = TransferFigures(s, smoke ? "mlp" : "gpt2");
  }
  out["ping_pong"] = PingPongFigures(s, smoke ? 200 : 5000);
  if (wanted("hooks")) {
    out["hooks"] = HookFigures(s, smoke ? "mlp" : "resnet50",
                               out["ping_pong"]["p50_us"].get<double>());
  }
  if (wanted("concurrency")) {
    out["concurrency"] =
        ConcurrencyFigures(s, smoke ? "mlp" : "linear16",
                           smoke ? 4 : absl::GetFlag(FLAGS_clients));
  }
  if (wanted("restore")) {
    out["restore"] = RestoreFigures(absl::GetFlag(FLAGS_server), smoke);
  }
  if (wanted("attest")) {
    out["attest"] = AttestFigures(s, smoke ? "mlp" : "gpt2");
  }
  if (wanted("shared_memory")) {
    out["shared_memory"] = SharedMemoryFigures(s, smoke ? "mlp" : "gpt2");
  }
  if (wanted("idle_latency")) {
    out["idle_latency"] = IdleLatencyFigures(s, smoke ? 10 : 200);
  }
  if (wanted("mapped")) {
    out["mapped"] =
        MappedFigures(absl::GetFlag(FLAGS_server), smoke ? "mlp" : "gpt2");
  }
  out["reps"] = absl::GetFlag(FLAGS_reps);
  out["warmup"] = absl::GetFlag(FLAGS_warmup);
  std::ofstream(absl::GetFlag(FLAGS_out)) << out.dump(2) << "\n";
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace modelstate::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Before any thread starts: arenas made earlier would stay in use.
  if (absl::GetFlag(FLAGS_reuse_message_memory) &&
      !modelstate::ReuseMessageMemory()) {
    std::cerr << "transfer_bench: malloc refused the settings\n";
    return 1;
  }
  if (absl::GetFlag(FLAGS_serve_raw)) {
    return modelstate::bench::RunRawServer(absl::GetFlag(FLAGS_listen),
                                           absl::GetFlag(FLAGS_ready_file));
  }
  return modelstate::bench::Run();
}

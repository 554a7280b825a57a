// File: raw_grpc.h
// The raw gRPC baseline: a minimal service that moves the same bytes in the
// same chunks as the modelstate transfers (and a bare ping-pong), so the
// benchmarks can report modelstate's figures as ratios against what gRPC
// itself does on this machine, measured in the same run.
//
// Example:
//   RunRawServer("127.0.0.1:0", "ready.txt");          // in its own process
//   RawClient raw(grpc::CreateChannel(address, ...));
//   absl::StatusOr<double> s = raw.Download(bytes, 1 << 20);
#ifndef MODELSTATE_TESTS_BENCH_RAW_GRPC_H_
#define MODELSTATE_TESTS_BENCH_RAW_GRPC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "raw_bench.grpc.pb.h"

namespace modelstate::bench {

// Serves RawBench on `listen` until the process is killed; writes the
// bound address to `ready_file` once serving. Returns only on error.
int RunRawServer(const std::string& listen, const std::string& ready_file);

class RawClient {
 public:
  explicit RawClient(std::shared_ptr<grpc::Channel> channel);

  // Seconds to receive `total` bytes in `chunk`-byte messages (each
  // message's bytes are touched, as a client that keeps them would).
  absl::StatusOr<double> Download(uint64_t total, uint32_t chunk);
  // Seconds to send `total` bytes in `chunk`-byte messages from memory.
  absl::StatusOr<double> Upload(uint64_t total, uint32_t chunk);
  // Round-trip times, in microseconds, of `count` one-byte messages on one
  // bidirectional stream, after `warmup` untimed ones.
  absl::StatusOr<std::vector<double>> PingPong(int count, int warmup);

 private:
  std::unique_ptr<rawbench::v1::RawBench::Stub> stub_;
};

}  // namespace modelstate::bench

#endif  // MODELSTATE_TESTS_BENCH_RAW_GRPC_H_

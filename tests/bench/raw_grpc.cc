#include "raw_grpc.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace modelstate::bench {
namespace {

// A chunk's worth of non-zero bytes (zeros could be special-cased by
// nobody, but say what is sent).
std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 131 + 7);
  return s;
}

class RawService final : public rawbench::v1::RawBench::Service {
 public:
  grpc::Status Download(
      grpc::ServerContext*, const rawbench::v1::DownloadRequest* request,
      grpc::ServerWriter<rawbench::v1::Chunk>* writer) override {
    const uint32_t chunk = std::max<uint32_t>(1, request->chunk_bytes());
    const std::string source = Pattern(chunk);
    rawbench::v1::Chunk message;
    for (uint64_t sent = 0; sent < request->total_bytes();) {
      size_t n = static_cast<size_t>(
          std::min<uint64_t>(chunk, request->total_bytes() - sent));
      // Copied into the message, as GetStateDict copies from a tensor.
      message.set_data(source.data(), n);
      if (!writer->Write(message)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      }
      sent += n;
    }
    return grpc::Status::OK;
  }

  grpc::Status Upload(grpc::ServerContext*,
                      grpc::ServerReader<rawbench::v1::Chunk>* reader,
                      rawbench::v1::UploadSummary* summary) override {
    rawbench::v1::Chunk message;
    uint64_t bytes = 0;
    while (reader->Read(&message)) bytes += message.data().size();
    summary->set_bytes(bytes);
    return grpc::Status::OK;
  }

  grpc::Status PingPong(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<rawbench::v1::Chunk, rawbench::v1::Chunk>*
          stream) override {
    rawbench::v1::Chunk message;
    while (stream->Read(&message)) {
      if (!stream->Write(message)) break;
    }
    return grpc::Status::OK;
  }
};

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

int RunRawServer(const std::string& listen, const std::string& ready_file) {
  RawService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  // The same message limits modelstate-server sets.
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return 1;
  {
    std::string host = listen.substr(0, listen.rfind(':'));
    std::ofstream(ready_file + ".tmp") << host << ":" << port << "\n";
    std::rename((ready_file + ".tmp").c_str(), ready_file.c_str());
  }
  server->Wait();
  return 0;
}

RawClient::RawClient(std::shared_ptr<grpc::Channel> channel)
    : stub_(rawbench::v1::RawBench::NewStub(std::move(channel))) {}

absl::StatusOr<double> RawClient::Download(uint64_t total, uint32_t chunk) {
  grpc::ClientContext context;
  rawbench::v1::DownloadRequest request;
  request.set_total_bytes(total);
  request.set_chunk_bytes(chunk);
  auto start = std::chrono::steady_clock::now();
  auto reader = stub_->Download(&context, request);
  rawbench::v1::Chunk message;
  uint64_t received = 0;
  while (reader->Read(&message)) received += message.data().size();
  grpc::Status status = reader->Finish();
  double seconds = Since(start);
  if (!status.ok()) return absl::InternalError(status.error_message());
  if (received != total) {
    return absl::InternalError(
        absl::StrCat("raw download got ", received, " of ", total, " bytes"));
  }
  return seconds;
}

absl::StatusOr<double> RawClient::Upload(uint64_t total, uint32_t chunk) {
  const std::string source = Pattern(chunk);
  grpc::ClientContext context;
  rawbench::v1::UploadSummary summary;
  auto start = std::chrono::steady_clock::now();
  auto writer = stub_->Upload(&context, &summary);
  rawbench::v1::Chunk message;
  for (uint64_t sent = 0; sent < total;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, total - sent));
    message.set_data(source.data(), n);
    if (!writer->Write(message)) break;
    sent += n;
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  double seconds = Since(start);
  if (!status.ok()) return absl::InternalError(status.error_message());
  if (summary.bytes() != total) {
    return absl::InternalError(
        absl::StrCat("raw upload delivered ", summary.bytes(), " of ", total));
  }
  return seconds;
}

absl::StatusOr<std::vector<double>> RawClient::PingPong(int count, int warmup) {
  grpc::ClientContext context;
  auto stream = stub_->PingPong(&context);
  rawbench::v1::Chunk ping;
  ping.set_data("x");
  rawbench::v1::Chunk pong;
  std::vector<double> micros;
  for (int i = 0; i < warmup + count; ++i) {
    auto start = std::chrono::steady_clock::now();
    if (!stream->Write(ping) || !stream->Read(&pong)) {
      return absl::InternalError("ping-pong stream broke");
    }
    if (i >= warmup) micros.push_back(Since(start) * 1e6);
  }
  stream->WritesDone();
  grpc::Status status = stream->Finish();
  if (!status.ok()) return absl::InternalError(status.error_message());
  return micros;
}

}  // namespace modelstate::bench

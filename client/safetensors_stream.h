// File: safetensors_stream.h
// Streams a state_dict between a safetensors file and the service chunk by
// chunk: a sink that writes what GetStateDict sends, and a source that
// reads a file for LoadStateDict. Neither holds the state in memory.
//
// Example:
//   SafetensorsSink sink("model.safetensors");
//   MODELSTATE_RETURN_IF_ERROR(client->GetStateDict("team/mlp", {}, sink));
//   MODELSTATE_ASSIGN_OR_RETURN(
//       auto source, SafetensorsSource::Open("model.safetensors"));
//   MODELSTATE_ASSIGN_OR_RETURN(auto r,
//                               client->LoadStateDict("team/mlp", *source));
#ifndef MODELSTATE_CLIENT_SAFETENSORS_STREAM_H_
#define MODELSTATE_CLIENT_SAFETENSORS_STREAM_H_

#include <memory>
#include <string>

#include "client/model_state_client.h"
#include "core/safetensors.h"

namespace modelstate::client {

// Writes the streamed state_dict to `path` (atomically: the file appears
// complete or not at all).
class SafetensorsSink : public StateDictSink {
 public:
  explicit SafetensorsSink(std::string path) : path_(std::move(path)) {}
  absl::Status Begin(const StateDictLayout& layout) override;
  absl::Status Append(absl::string_view bytes) override;
  absl::Status Finish() override;

 private:
  std::string path_;
  std::unique_ptr<SafetensorsFileWriter> writer_;
};

// Reads a safetensors file's tensors in data order.
class SafetensorsSource : public StateDictSource {
 public:
  // NOT_FOUND / INVALID_ARGUMENT naming the file.
  static absl::StatusOr<std::unique_ptr<SafetensorsSource>> Open(
      const std::string& path);
  ~SafetensorsSource() override;
  const StateDictLayout& layout() const override { return layout_; }
  absl::StatusOr<size_t> Read(size_t max_bytes, std::string* out) override;

 private:
  SafetensorsSource() = default;
  std::string path_;
  int fd_ = -1;
  StateDictLayout layout_;
  uint64_t data_start_ = 0;
  uint64_t position_ = 0;
};

}  // namespace modelstate::client

#endif  // MODELSTATE_CLIENT_SAFETENSORS_STREAM_H_

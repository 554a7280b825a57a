#include "client/safetensors_stream.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "core/state_digest.h"

namespace modelstate::client {

absl::Status SafetensorsSink::Begin(const StateDictLayout& layout) {
  // The layout the server hashes for SignStateFile (core/state_digest.h).
  MODELSTATE_ASSIGN_OR_RETURN(
      writer_, SafetensorsFileWriter::Open(path_, StateFileEntries(layout),
                                           StateFileMetadata()));
  return absl::OkStatus();
}

absl::Status SafetensorsSink::Append(absl::string_view bytes) {
  return writer_->Append(bytes);
}

absl::Status SafetensorsSink::Finish() { return writer_->Finish(); }

absl::StatusOr<std::unique_ptr<SafetensorsSource>> SafetensorsSource::Open(
    const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(SafetensorsHeader header,
                              ReadSafetensorsHeader(path));
  std::unique_ptr<SafetensorsSource> source(new SafetensorsSource());
  source->path_ = path;
  source->fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (source->fd_ < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  for (const SafetensorsEntry& e : header.entries) {
    StateDictLayoutEntry l;
    l.key = e.key;
    l.dtype = e.dtype;
    l.shape = e.shape;
    l.nbytes = e.end - e.begin;
    source->layout_.total_bytes += l.nbytes;
    source->layout_.entries.push_back(std::move(l));
  }
  source->data_start_ = header.data_start;
  return source;
}

SafetensorsSource::~SafetensorsSource() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<size_t> SafetensorsSource::Read(size_t max_bytes,
                                               std::string* out) {
  size_t n = static_cast<size_t>(
      std::min<uint64_t>(max_bytes, layout_.total_bytes - position_));
  if (n == 0) return 0;
  size_t old = out->size();
  out->resize(old + n);
  size_t done = 0;
  while (done < n) {
    ssize_t r = pread(fd_, out->data() + old + done, n - done,
                      static_cast<off_t>(data_start_ + position_ + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      return absl::DataLossError(
          absl::StrCat(path_, ": could not read tensor data (",
                       r < 0 ? std::strerror(errno) : "file shrank", ")"));
    }
    done += static_cast<size_t>(r);
  }
  position_ += n;
  return n;
}

}  // namespace modelstate::client

#include "core/staged_state_dict.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "base/file_util.h"
#include "base/status_macros.h"

namespace modelstate {
namespace {

// Conversions between dtypes go through a buffer of about this size.
constexpr uint64_t kConversionChunkBytes = 4 << 20;
// Append waits while this much is queued for the writer thread.
constexpr uint64_t kMaxQueuedBytes = 16 << 20;

// An unlinked file in `dir`: O_TMPFILE where the filesystem has it, else a
// named file removed right after it was opened.
absl::StatusOr<int> OpenAnonymousFile(const std::string& dir) {
  int fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  std::string name = dir + "/staging-XXXXXX";
  fd = mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, dir, "cannot create a staging file");
  unlink(name.c_str());
  return fd;
}

// A disk failure while staging (a full disk, a file size limit) is the
// server's problem, not a bad request: INTERNAL, whatever errno said, with
// the file and the cause.
absl::Status StagingFailed(const absl::Status& cause) {
  return absl::InternalError(
      absl::StrCat("the state_dict could not be written to disk (",
                   cause.message(), "); nothing was loaded"));
}

}  // namespace

StagedStateDict::StagedStateDict(StateDictLayout layout)
    : layout_(std::move(layout)) {
  uint64_t offset = 0;
  for (size_t i = 0; i < layout_.entries.size(); ++i) {
    index_.emplace(layout_.entries[i].key, i);
    offsets_.push_back(offset);
    offset += layout_.entries[i].nbytes;
  }
  crcs_.assign(layout_.entries.size(), 0);
}

absl::StatusOr<std::unique_ptr<StagedStateDict>>
StagedStateDict::CreateAnonymous(StateDictLayout layout,
                                 const StreamLimits& limits,
                                 const std::string& dir) {
  MODELSTATE_RETURN_IF_ERROR(ValidateLayout(layout, limits));
  std::unique_ptr<StagedStateDict> staged(
      new StagedStateDict(std::move(layout)));
  MODELSTATE_ASSIGN_OR_RETURN(staged->fd_, OpenAnonymousFile(dir));
  staged->StartWriter();
  return staged;
}

absl::StatusOr<std::unique_ptr<StagedStateDict>> StagedStateDict::CreateFile(
    StateDictLayout layout, const StreamLimits& limits, const std::string& path,
    std::function<void()> on_close) {
  MODELSTATE_RETURN_IF_ERROR(ValidateLayout(layout, limits));
  std::vector<SafetensorsEntry> entries;
  for (const StateDictLayoutEntry& e : layout.entries) {
    entries.push_back({e.key, e.dtype, e.shape});
  }
  std::unique_ptr<StagedStateDict> staged(
      new StagedStateDict(std::move(layout)));
  staged->path_ = path;
  staged->on_close_ = std::move(on_close);
  MODELSTATE_ASSIGN_OR_RETURN(staged->writer_,
                              SafetensorsFileWriter::Open(path, entries));
  staged->data_start_ = staged->writer_->data_start();
  staged->StartWriter();
  return staged;
}

StagedStateDict::~StagedStateDict() {
  {
    MutexLock lock(&mu_);
    abandoned_ = true;  // nothing more to write or observe
    changed_.SignalAll();
  }
  Drain().IgnoreError();
  if (fd_ >= 0) close(fd_);
  // A finished file nobody adopted; an unfinished one is the writer's.
  if (finished_ && !path_.empty() && !keep_) unlink(path_.c_str());
  writer_.reset();
  if (on_close_) on_close_();
}

void StagedStateDict::StartWriter() {
  writer_thread_ = std::thread([this] { ConsumeQueued(kWriter); });
}

absl::Status StagedStateDict::Observe(
    std::function<void(absl::string_view)> observe) {
  {
    MutexLock lock(&mu_);
    if (has_observer_ || received_ != 0 || stopping_) {
      return absl::FailedPreconditionError(
          "an observer is set once, before the first bytes");
    }
    has_observer_ = true;
  }
  observe_ = std::move(observe);
  observer_thread_ = std::thread([this] { ConsumeQueued(kObserver); });
  return absl::OkStatus();
}

absl::Status StagedStateDict::Append(std::string bytes) {
  if (bytes.size() > layout_.total_bytes - received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("data: received more than the ", layout_.total_bytes,
                     " bytes the header declares"));
  }
  MutexLock lock(&mu_);
  received_ += bytes.size();
  while (write_status_.ok() && queued_bytes_ >= kMaxQueuedBytes) {
    changed_.Wait(&mu_);
  }
  if (!write_status_.ok()) return write_status_;
  queued_bytes_ += bytes.size();
  queue_.push_back(std::move(bytes));
  changed_.SignalAll();
  return absl::OkStatus();
}

void StagedStateDict::ConsumeQueued(Consumer who) {
  while (true) {
    const std::string* piece = nullptr;
    {
      MutexLock lock(&mu_);
      while (consumed_[who] == queue_.size() && !stopping_ && !abandoned_ &&
             write_status_.ok()) {
        changed_.Wait(&mu_);
      }
      if (abandoned_ || !write_status_.ok() ||
          consumed_[who] == queue_.size()) {
        return;
      }
      piece = &queue_[consumed_[who]];
    }
    absl::Status done;
    if (who == kWriter) {
      done = WritePiece(*piece);
    } else {
      observe_(*piece);
    }
    MutexLock lock(&mu_);
    ++consumed_[who];
    if (!done.ok() && write_status_.ok()) write_status_ = StagingFailed(done);
    DropConsumedPieces();
    changed_.SignalAll();
  }
}

void StagedStateDict::DropConsumedPieces() {
  while (!queue_.empty() && consumed_[kWriter] > 0 &&
         (!has_observer_ || consumed_[kObserver] > 0)) {
    queued_bytes_ -= queue_.front().size();
    queue_.pop_front();
    --consumed_[kWriter];
    if (has_observer_) --consumed_[kObserver];
  }
}

absl::Status StagedStateDict::Drain() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
  }
  if (writer_thread_.joinable()) writer_thread_.join();
  if (observer_thread_.joinable()) observer_thread_.join();
  MutexLock lock(&mu_);
  return write_status_;
}

absl::Status StagedStateDict::WritePiece(absl::string_view bytes) {
  if (writer_ == nullptr) return WriteAll(fd_, bytes, "the staging file");
  MODELSTATE_RETURN_IF_ERROR(writer_->Append(bytes));
  // Each entry's CRC, for the durable store that adopts the file.
  while (!bytes.empty()) {
    while (entry_ < layout_.entries.size() &&
           entry_done_ == layout_.entries[entry_].nbytes) {
      ++entry_;
      entry_done_ = 0;
    }
    size_t n = static_cast<size_t>(std::min<uint64_t>(
        bytes.size(), layout_.entries[entry_].nbytes - entry_done_));
    crcs_[entry_] = Crc32cExtend(crcs_[entry_], bytes.substr(0, n));
    entry_done_ += n;
    bytes.remove_prefix(n);
  }
  return absl::OkStatus();
}

StateDict StagedStateDict::Describe() const {
  StateDict described;
  for (const StateDictLayoutEntry& e : layout_.entries) {
    // Validated shapes: Empty cannot fail on meta.
    described.tensors.Set(e.key,
                          *Tensor::Empty(e.dtype, e.shape, Device::Meta()));
  }
  if (layout_.metadata.has_value()) {
    described.metadata.emplace();
    for (const auto& [path, version] : *layout_.metadata) {
      described.metadata->Set(path, version);
    }
  }
  return described;
}

absl::StatusOr<StateDict> StagedStateDict::Finish() {
  if (received_ != layout_.total_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the stream ended after ", received_, " of ",
                     layout_.total_bytes, " data bytes"));
  }
  MODELSTATE_RETURN_IF_ERROR(Drain());
  if (writer_ != nullptr && !finished_) {
    if (absl::Status done = writer_->Finish(); !done.ok()) {
      return StagingFailed(done);
    }
    finished_ = true;
    fd_ = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return ErrnoStatus(errno, path_, "cannot reopen");
  }
  return Describe();
}

const StateDictLayoutEntry* StagedStateDict::Find(const std::string& key,
                                                  size_t* index,
                                                  uint64_t* offset) const {
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  *index = it->second;
  *offset = offsets_[it->second];
  return &layout_.entries[it->second];
}

absl::Status StagedStateDict::ReadData(char* out, uint64_t n, uint64_t offset) {
  return PreadAll(fd_, out, n, data_start_ + offset,
                  path_.empty() ? "the staging file" : path_);
}

absl::StatusOr<Tensor> StagedStateDict::Read(const std::string& key) {
  size_t index = 0;
  uint64_t offset = 0;
  const StateDictLayoutEntry* e = Find(key, &index, &offset);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat("no staged entry '", key, "'"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(e->dtype, e->shape));
  MODELSTATE_ASSIGN_OR_RETURN(void* data, t.MutableDataForOverwrite());
  MODELSTATE_RETURN_IF_ERROR(
      ReadData(static_cast<char*>(data), e->nbytes, offset));
  return t;
}

absl::Status StagedStateDict::CopyInto(const std::string& key, Tensor& target) {
  size_t index = 0;
  uint64_t offset = 0;
  const StateDictLayoutEntry* e = Find(key, &index, &offset);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat("no staged entry '", key, "'"));
  }
  const uint64_t count = static_cast<uint64_t>(target.numel());
  const size_t in_size = ElementSize(e->dtype);
  const uint64_t available = e->nbytes / in_size;
  if (count > available) {
    return absl::InvalidArgumentError(
        absl::StrCat("The size of tensor a (", count,
                     ") must match the size of tensor b (", available, ")"));
  }
  // A tensor without storage (meta) takes no bytes, and it is no copy of
  // the file's entry.
  if (!target.device().has_storage()) return absl::OkStatus();
  if (e->dtype == target.dtype()) {
    // Read straight into the target (an accelerator's: into its staging
    // buffers), with no host copy between.
    MODELSTATE_ASSIGN_OR_RETURN(void* dst, target.MutableDataForOverwrite());
    MODELSTATE_RETURN_IF_ERROR(
        FillBytes(target.device(), dst, count * in_size,
                  [&](void* piece, size_t piece_offset, size_t length) {
                    return ReadData(static_cast<char*>(piece), length,
                                    offset + piece_offset);
                  }));
    if (finished_ && count == available) {
      copied_.push_back({target.storage(), e->dtype, e->key, crcs_[index]});
    }
    return absl::OkStatus();
  }
  if (!target.device().is_cpu()) {
    // An accelerator converts a host copy of its elements in one transfer.
    MODELSTATE_ASSIGN_OR_RETURN(Tensor host,
                                Tensor::Empty(e->dtype, target.shape()));
    MODELSTATE_ASSIGN_OR_RETURN(void* data, host.MutableDataForOverwrite());
    MODELSTATE_RETURN_IF_ERROR(
        ReadData(static_cast<char*>(data), host.nbytes(), offset));
    return target.CopyFrom(host);
  }
  MODELSTATE_ASSIGN_OR_RETURN(void* dst, target.MutableDataForOverwrite());
  char* out = static_cast<char*>(dst);
  const size_t out_size = ElementSize(target.dtype());
  // Different dtypes: read a piece, convert it, next piece.
  const uint64_t per_chunk =
      std::max<uint64_t>(1, kConversionChunkBytes / in_size);
  std::vector<char> buffer(std::min(count, per_chunk) * in_size);
  for (uint64_t done = 0; done < count;) {
    uint64_t n = std::min(per_chunk, count - done);
    MODELSTATE_RETURN_IF_ERROR(
        ReadData(buffer.data(), n * in_size, offset + done * in_size));
    ConvertElements(buffer.data(), e->dtype, out + done * out_size,
                    target.dtype(), static_cast<int64_t>(n));
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace modelstate

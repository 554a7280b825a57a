#include "core/staged_state_dict.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/status_macros.h"

namespace modelstate {
namespace {

// Conversions between dtypes go through a buffer of about this size.
constexpr uint64_t kConversionChunkBytes = 4 << 20;

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

}  // namespace

absl::StatusOr<std::unique_ptr<StagedStateDict>> StagedStateDict::Create(
    StateDictLayout layout, const StreamLimits& limits,
    const std::string& dir) {
  MODELSTATE_RETURN_IF_ERROR(ValidateLayout(layout, limits));
  MODELSTATE_ASSIGN_OR_RETURN(int fd, OpenAnonymousFile(dir));
  return std::unique_ptr<StagedStateDict>(
      new StagedStateDict(std::move(layout), fd, dir + "/(staging)"));
}

StagedStateDict::StagedStateDict(StateDictLayout layout, int fd,
                                 std::string path)
    : layout_(std::move(layout)), fd_(fd), path_(std::move(path)) {
  uint64_t offset = 0;
  for (size_t i = 0; i < layout_.entries.size(); ++i) {
    index_.emplace(layout_.entries[i].key, i);
    offsets_.push_back(offset);
    offset += layout_.entries[i].nbytes;
  }
}

StagedStateDict::~StagedStateDict() { close(fd_); }

absl::Status StagedStateDict::Append(absl::string_view bytes) {
  if (bytes.size() > layout_.total_bytes - received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("data: received more than the ", layout_.total_bytes,
                     " bytes the header declares"));
  }
  MODELSTATE_RETURN_IF_ERROR(WriteAll(fd_, bytes, path_));
  received_ += bytes.size();
  return absl::OkStatus();
}

absl::StatusOr<StateDict> StagedStateDict::Finish() {
  if (received_ != layout_.total_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the stream ended after ", received_, " of ",
                     layout_.total_bytes, " data bytes"));
  }
  StateDict described;
  for (const StateDictLayoutEntry& e : layout_.entries) {
    MODELSTATE_ASSIGN_OR_RETURN(
        Tensor t, Tensor::Empty(e.dtype, e.shape, Device::Meta()));
    described.tensors.Set(e.key, std::move(t));
  }
  if (layout_.metadata.has_value()) {
    described.metadata.emplace();
    for (const auto& [path, version] : *layout_.metadata) {
      described.metadata->Set(path, version);
    }
  }
  return described;
}

const StateDictLayoutEntry* StagedStateDict::Find(const std::string& key,
                                                  uint64_t* offset) const {
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  *offset = offsets_[it->second];
  return &layout_.entries[it->second];
}

absl::StatusOr<Tensor> StagedStateDict::Read(const std::string& key) {
  uint64_t offset = 0;
  const StateDictLayoutEntry* e = Find(key, &offset);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat("no staged entry '", key, "'"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(e->dtype, e->shape));
  MODELSTATE_ASSIGN_OR_RETURN(void* data, t.MutableDataForOverwrite());
  MODELSTATE_RETURN_IF_ERROR(
      PreadAll(fd_, static_cast<char*>(data), e->nbytes, offset, path_));
  return t;
}

absl::Status StagedStateDict::CopyInto(const std::string& key, Tensor& target) {
  uint64_t offset = 0;
  const StateDictLayoutEntry* e = Find(key, &offset);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat("no staged entry '", key, "'"));
  }
  const uint64_t count = static_cast<uint64_t>(target.numel());
  uint64_t available = e->nbytes / ElementSize(e->dtype);
  if (count > available) {
    return absl::InvalidArgumentError(
        absl::StrCat("The size of tensor a (", count,
                     ") must match the size of tensor b (", available, ")"));
  }
  if (!target.device().is_cpu()) {
    // An accelerator takes a host copy of its elements in one transfer.
    MODELSTATE_ASSIGN_OR_RETURN(Tensor host,
                                Tensor::Empty(e->dtype, target.shape()));
    MODELSTATE_ASSIGN_OR_RETURN(void* data, host.MutableDataForOverwrite());
    MODELSTATE_RETURN_IF_ERROR(
        PreadAll(fd_, static_cast<char*>(data), host.nbytes(), offset, path_));
    return target.CopyFrom(host);
  }
  MODELSTATE_ASSIGN_OR_RETURN(void* dst, target.MutableDataForOverwrite());
  char* out = static_cast<char*>(dst);
  const size_t in_size = ElementSize(e->dtype);
  const size_t out_size = ElementSize(target.dtype());
  if (e->dtype == target.dtype()) {
    return PreadAll(fd_, out, count * in_size, offset, path_);
  }
  // Different dtypes: read a piece, convert it, next piece.
  const uint64_t per_chunk =
      std::max<uint64_t>(1, kConversionChunkBytes / in_size);
  std::vector<char> buffer(std::min(count, per_chunk) * in_size);
  for (uint64_t done = 0; done < count;) {
    uint64_t n = std::min(per_chunk, count - done);
    MODELSTATE_RETURN_IF_ERROR(PreadAll(fd_, buffer.data(), n * in_size,
                                        offset + done * in_size, path_));
    ConvertElements(buffer.data(), e->dtype, out + done * out_size,
                    target.dtype(), static_cast<int64_t>(n));
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace modelstate

#include "core/state_digest.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace modelstate {

absl::StatusOr<std::vector<AttestedResource>> StateDictSubjects(
    const StateDict& state, int threads) {
  std::vector<Tensor> host;  // keeps CPU copies alive while hashing
  std::vector<absl::string_view> bytes;
  for (const auto& item : state.tensors) {
    Tensor t = item.value;
    MODELSTATE_RETURN_IF_ERROR(CheckTensorBytes(item.key, t));
    if (t.defined() && !t.device().is_cpu()) {
      if (t.device().is_meta()) {
        return absl::FailedPreconditionError(
            absl::StrCat("state_dict entry '", item.key,
                         "' is on meta: it has no bytes to attest"));
      }
      MODELSTATE_ASSIGN_OR_RETURN(t, t.To(Device::Cpu(), t.dtype()));
    }
    const char* data =
        t.defined() ? static_cast<const char*>(t.raw_data()) : nullptr;
    bytes.push_back(data == nullptr ? absl::string_view()
                                    : absl::string_view(data, t.nbytes()));
    host.push_back(std::move(t));
  }
  std::vector<std::string> digests = Sha256HexAll(bytes, threads);
  std::vector<AttestedResource> out;
  size_t i = 0;
  for (const auto& item : state.tensors) {
    std::string annotations;
    if (item.value.defined()) {
      // Names and integers only: no JSON escaping needed.
      annotations = absl::StrCat("{\"dtype\":\"", DTypeName(item.value.dtype()),
                                 "\",\"shape\":[",
                                 absl::StrJoin(item.value.shape(), ","), "]}");
    }
    out.push_back({item.key, std::move(digests[i++]), std::move(annotations)});
  }
  return out;
}

absl::StatusOr<std::string> StateSha256(std::vector<AttestedResource> entries) {
  std::sort(entries.begin(), entries.end(),
            [](const AttestedResource& a, const AttestedResource& b) {
              return a.name < b.name;
            });
  std::vector<std::string> digests;
  digests.reserve(entries.size());
  for (AttestedResource& e : entries) digests.push_back(std::move(e.sha256));
  return Sha256OfDigests(digests);
}

StateDictStreamDigest::StateDictStreamDigest(const StateDictLayout& layout) {
  for (const StateDictLayoutEntry& e : layout.entries) {
    keys_.push_back(e.key);
    sizes_.push_back(e.nbytes);
  }
  FinishCompleteEntries();
}

void StateDictStreamDigest::FinishCompleteEntries() {
  while (!complete()) {
    const size_t i = digests_.size();
    if (current_ == nullptr) current_ = std::make_unique<Sha256>();
    if (current_bytes_ < sizes_[i]) return;
    digests_.push_back(current_->FinishHex());
    current_.reset();
    current_bytes_ = 0;
  }
}

void StateDictStreamDigest::Update(absl::string_view bytes) {
  while (!bytes.empty() && !complete()) {
    const uint64_t want = sizes_[digests_.size()] - current_bytes_;
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(want, bytes.size()));
    current_->Update(bytes.substr(0, n));
    current_bytes_ += n;
    bytes.remove_prefix(n);
    FinishCompleteEntries();
  }
}

absl::StatusOr<std::vector<AttestedResource>> StateDictStreamDigest::Entries()
    const {
  if (!complete()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the stream's entry '", keys_[digests_.size()], "' is incomplete"));
  }
  std::vector<AttestedResource> out;
  out.reserve(keys_.size());
  for (size_t i = 0; i < keys_.size(); ++i) {
    out.push_back({keys_[i], digests_[i], ""});
  }
  return out;
}

absl::StatusOr<std::string> StateDictStreamDigest::StateSha256() const {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<AttestedResource> entries, Entries());
  return modelstate::StateSha256(std::move(entries));
}

std::vector<SafetensorsEntry> StateFileEntries(const StateDictLayout& layout) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(layout.entries.size());
  for (const StateDictLayoutEntry& e : layout.entries) {
    SafetensorsEntry s;
    s.key = e.key;
    s.dtype = e.dtype;
    s.shape = e.shape;
    entries.push_back(std::move(s));
  }
  return entries;
}

const std::vector<std::pair<std::string, std::string>>& StateFileMetadata() {
  static const auto* const kMetadata =
      new std::vector<std::pair<std::string, std::string>>{{"format", "pt"}};
  return *kMetadata;
}

absl::StatusOr<FileDigest> StateFileSha256(StateDictReader& reader) {
  MODELSTATE_ASSIGN_OR_RETURN(
      std::string header,
      SerializeSafetensorsHeader(StateFileEntries(reader.layout()),
                                 StateFileMetadata()));
  Sha256 sha;
  sha.Update(header);
  FileDigest out;
  out.bytes = header.size();
  // Large reads: hashing, not the copy into `chunk`, sets the pace.
  constexpr size_t kChunkBytes = 8 << 20;
  std::string chunk;
  while (true) {
    chunk.clear();
    MODELSTATE_ASSIGN_OR_RETURN(size_t n, reader.Read(kChunkBytes, &chunk));
    if (n == 0) break;
    sha.Update(chunk);
    out.bytes += n;
  }
  out.sha256 = sha.FinishHex();
  return out;
}

}  // namespace modelstate

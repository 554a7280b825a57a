// File: staged_state_dict.h
// A state_dict that arrives as a stream (StateDictLayout, then its bytes in
// order) and is staged in a file instead of memory, so that loading it into
// a module never holds the state twice in RAM: the bytes go to an unlinked
// temporary file as they arrive, and the load reads each entry back
// straight into the module's tensor (LoadSource), converting dtypes in
// small pieces when they differ. The file vanishes when the object does,
// also if the process dies.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(auto staged,
//       StagedStateDict::Create(layout, limits, "data/staging"));
//   for (...) MODELSTATE_RETURN_IF_ERROR(staged->Append(chunk));
//   MODELSTATE_ASSIGN_OR_RETURN(StateDict described, staged->Finish());
//   LoadOptions options;
//   options.source = staged.get();
//   MODELSTATE_ASSIGN_OR_RETURN(LoadResult r,
//                               module->LoadStateDict(described, options));
#ifndef MODELSTATE_CORE_STAGED_STATE_DICT_H_
#define MODELSTATE_CORE_STAGED_STATE_DICT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/module.h"
#include "core/state_stream.h"

namespace modelstate {

// Thread-compatible.
class StagedStateDict : public LoadSource {
 public:
  // Validates `layout` (ValidateLayout) and opens the staging file in
  // `dir`, which must exist.
  static absl::StatusOr<std::unique_ptr<StagedStateDict>> Create(
      StateDictLayout layout, const StreamLimits& limits,
      const std::string& dir);
  ~StagedStateDict() override;

  // Consumes the next bytes of the stream. INVALID_ARGUMENT when more bytes
  // arrive than the layout declares.
  absl::Status Append(absl::string_view bytes);

  // Once exactly total_bytes arrived: a StateDict of meta tensors (each
  // entry's dtype and shape, with the layout's metadata) for
  // Module::LoadStateDict with this object as LoadOptions::source.
  // INVALID_ARGUMENT saying how many bytes are missing otherwise.
  absl::StatusOr<StateDict> Finish();

  // LoadSource.
  absl::Status CopyInto(const std::string& key, Tensor& target) override;
  absl::StatusOr<Tensor> Read(const std::string& key) override;

  uint64_t received() const { return received_; }

 private:
  StagedStateDict(StateDictLayout layout, int fd, std::string path);
  const StateDictLayoutEntry* Find(const std::string& key,
                                   uint64_t* offset) const;

  const StateDictLayout layout_;
  const int fd_;
  const std::string path_;  // for messages; the file itself is unlinked
  absl::flat_hash_map<std::string, size_t> index_;
  std::vector<uint64_t> offsets_;
  uint64_t received_ = 0;
};

}  // namespace modelstate

#endif  // MODELSTATE_CORE_STAGED_STATE_DICT_H_

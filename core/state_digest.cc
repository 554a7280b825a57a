#include "core/state_digest.h"

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

}  // namespace modelstate

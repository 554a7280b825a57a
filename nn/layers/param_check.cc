#include "nn/layers/param_check.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "nn/layers/forward_util.h"

namespace modelstate::internal {
namespace {

std::string Owner(const Module& m, absl::string_view owner) {
  return owner.empty() ? m.type_name() : std::string(owner);
}

}  // namespace

absl::Status CheckEntryShape(const Module& m, absl::string_view name,
                             const Tensor& t, const Shape& want,
                             absl::string_view owner) {
  if (t.defined() && t.shape() != want) {
    return absl::FailedPreconditionError(
        absl::StrCat(Owner(m, owner), ".", name, " has shape ",
                     Sizes(t.shape()), ", expected ", Sizes(want)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ShapedEntry(const Module& m, absl::string_view name,
                                   const Shape& want, Presence presence,
                                   absl::string_view owner) {
  Tensor t = Entry(m, name);
  if (!t.defined()) {
    if (presence == Presence::kOptional) return t;
    // None and absent differ only in what the user did to the module.
    const bool absent = m.parameters().Find(name) == nullptr &&
                        m.buffers().Find(name) == nullptr;
    return absl::FailedPreconditionError(absl::StrCat(
        Owner(m, owner), ".", name, absent ? " is missing" : " is None",
        ", expected a tensor of shape ", Sizes(want)));
  }
  MODELSTATE_RETURN_IF_ERROR(CheckEntryShape(m, name, t, want, owner));
  MODELSTATE_RETURN_IF_ERROR(CheckCpu(t));
  return t;
}

absl::StatusOr<Tensor> ShapedParam(const Module& m, absl::string_view name,
                                   DType dtype, const Shape& want,
                                   Presence presence, absl::string_view owner) {
  MODELSTATE_ASSIGN_OR_RETURN(Tensor t,
                              ShapedEntry(m, name, want, presence, owner));
  if (!t.defined()) return t;
  return Param(m, name, dtype);
}

absl::StatusOr<Tensor> RankedEntry(const Module& m, absl::string_view name,
                                   int64_t rank) {
  Tensor t = Entry(m, name);
  if (!t.defined() || t.dim() != rank) {
    return absl::FailedPreconditionError(
        absl::StrCat(m.type_name(), ".", name,
                     t.defined() ? absl::StrCat(" has shape ", Sizes(t.shape()))
                                 : std::string(" is None"),
                     ", expected a ", rank, "-d tensor"));
  }
  MODELSTATE_RETURN_IF_ERROR(CheckCpu(t));
  return t;
}

absl::Status CheckAttrAtLeast(const Module& m, absl::string_view attr,
                              const std::vector<int64_t>& values, int64_t min,
                              absl::string_view why) {
  for (int64_t v : values) {
    if (v < min) {
      return absl::FailedPreconditionError(absl::StrCat(
          m.type_name(), ".", attr, " is ",
          values.size() == 1
              ? absl::StrCat(values[0])
              : absl::StrCat("[", absl::StrJoin(values, ", "), "]"),
          ": ", why));
    }
  }
  return absl::OkStatus();
}

}  // namespace modelstate::internal

// File: param_check.h
// Private to the layer families: how a layer's forward gets the parameters
// and buffers it reads. A module's entries can be replaced after the build
// (RegisterParameter / RegisterBuffer accept None and, as PyTorch allows,
// tensors of another shape; a restored module holds what its manifest
// says), while the forward kernels index them with the layer's own extents.
// So every forward takes its entries through these functions, which check
// presence and the exact shape before any data is read: a wrong entry is
// the module's fault, FAILED_PRECONDITION naming it, never a read or write
// past the end of its storage.
//
// Example (Linear's forward):
//   MODELSTATE_ASSIGN_OR_RETURN(
//       Tensor w, ShapedParam(m, "weight", dtype, {out, in},
//       Presence::kRequired));
//   MODELSTATE_ASSIGN_OR_RETURN(
//       Tensor b, ShapedParam(m, "bias", dtype, {out}, Presence::kOptional));
//   // "Linear.weight has shape [3], expected [4, 5]"
//   // "Linear.weight is None, expected a tensor of shape [4, 5]"
#ifndef MODELSTATE_NN_LAYERS_PARAM_CHECK_H_
#define MODELSTATE_NN_LAYERS_PARAM_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/module.h"
#include "core/tensor.h"

namespace modelstate::internal {

// Whether a forward can run without the entry: optional entries are those
// PyTorch's functional form takes as None (a bias, an affine weight, the
// running statistics), required ones those it cannot do without.
enum class Presence { kRequired, kOptional };

// FAILED_PRECONDITION "<owner>.<name> has shape [3], expected [20, 5]"
// unless `t` is undefined or has exactly `want`. `owner` names the module
// in the message ("" for m's type name; "MultiheadAttention.out_proj" for
// a submodule's entry read by its parent).
absl::Status CheckEntryShape(const Module& m, absl::string_view name,
                             const Tensor& t, const Shape& want,
                             absl::string_view owner = "");

// Entry `name` of `m` (parameter or buffer) as a forward reads it, in its
// own dtype: on the CPU, exactly of shape `want`; undefined only when
// optional and None or absent. FAILED_PRECONDITION otherwise ("<owner>.<name>
// is None, expected a tensor of shape [10, 4]").
absl::StatusOr<Tensor> ShapedEntry(const Module& m, absl::string_view name,
                                   const Shape& want, Presence presence,
                                   absl::string_view owner = "");

// ShapedEntry, then Param's dtype rule (forward_util.h): of the input's
// `dtype` (PyTorch's INVALID_ARGUMENT text otherwise), widened like the
// input for the kernels.
absl::StatusOr<Tensor> ShapedParam(const Module& m, absl::string_view name,
                                   DType dtype, const Shape& want,
                                   Presence presence,
                                   absl::string_view owner = "");

// The weight of a layer whose functional form takes its extents from the
// weight itself (F.linear, F.bilinear, F.embedding, F.conv*d): PyTorch lets
// a weight of another shape be assigned, and the forward then follows it.
// Only its presence and rank are checked ("Linear.weight has shape [3],
// expected a 2-d tensor"); the caller checks what its extents must agree
// with (the bias, groups).
absl::StatusOr<Tensor> RankedEntry(const Module& m, absl::string_view name,
                                   int64_t rank);

// FAILED_PRECONDITION "<Type>.<attr> is <value>: <why>" unless every value
// of a size attribute (stride, dilation, kernel_size, groups...) is at least
// `min`: the build checks these, but a module restored or built another way
// must still not reach a division by zero. `why` is PyTorch's text where it
// has one ("non-positive stride is not supported").
absl::Status CheckAttrAtLeast(const Module& m, absl::string_view attr,
                              const std::vector<int64_t>& values, int64_t min,
                              absl::string_view why);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_LAYERS_PARAM_CHECK_H_

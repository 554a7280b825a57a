// File: status_macros.h
// Propagation helpers for absl::Status / absl::StatusOr, until the Abseil
// baseline ships absl/status/status_macros.h.
//
// Example:
//   absl::StatusOr<Tensor> MakeWeight() {
//     MODELSTATE_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(DType::kFloat32,
//     {3})); MODELSTATE_RETURN_IF_ERROR(Fill(t, 1.0)); return t;
//   }
#ifndef MODELSTATE_BASE_STATUS_MACROS_H_
#define MODELSTATE_BASE_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MODELSTATE_INTERNAL_CONCAT_IMPL(a, b) a##b
#define MODELSTATE_INTERNAL_CONCAT(a, b) MODELSTATE_INTERNAL_CONCAT_IMPL(a, b)

// Returns from the enclosing function if `expr` yields a non-OK status.
#define MODELSTATE_RETURN_IF_ERROR(expr)                     \
  do {                                                       \
    ::absl::Status modelstate_status_ = (expr);              \
    if (!modelstate_status_.ok()) return modelstate_status_; \
  } while (0)

// Evaluates `rexpr` (a StatusOr); on error returns its status, otherwise
// moves the value into `lhs` (which may be a declaration).
#define MODELSTATE_ASSIGN_OR_RETURN(lhs, rexpr)                           \
  MODELSTATE_INTERNAL_ASSIGN_OR_RETURN(                                   \
      MODELSTATE_INTERNAL_CONCAT(modelstate_statusor_, __COUNTER__), lhs, \
      rexpr)

#define MODELSTATE_INTERNAL_ASSIGN_OR_RETURN(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                         \
  if (!statusor.ok()) return std::move(statusor).status();         \
  lhs = std::move(*statusor)

#endif  // MODELSTATE_BASE_STATUS_MACROS_H_

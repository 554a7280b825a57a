// File: tensors.h
// Test helpers for making tensors in one line and comparing state dicts.
//
// Example:
//   Tensor w = Filled(DType::kFloat32, {2, 3}, 0.5);
//   ExpectSameState(client_state, local_module->GetStateDict());
#ifndef MODELSTATE_TESTS_TESTING_TENSORS_H_
#define MODELSTATE_TESTS_TESTING_TENSORS_H_

#include <utility>

#include "absl/status/statusor.h"
#include "core/module.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace modelstate::testing {

inline Tensor Filled(DType dtype, Shape shape, double value) {
  absl::StatusOr<Tensor> t = Tensor::Full(dtype, std::move(shape), value);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : Tensor();
}

inline Tensor Zeros(Shape shape, DType dtype = DType::kFloat32) {
  return Filled(dtype, std::move(shape), 0.0);
}

// Same keys in the same order, and every tensor equal in dtype, shape and
// bytes.
inline void ExpectSameState(const StateDict& got, const StateDict& want) {
  ASSERT_EQ(got.tensors.Keys(), want.tensors.Keys());
  for (const auto& item : want.tensors) {
    const Tensor* t = got.tensors.Find(item.key);
    ASSERT_NE(t, nullptr) << item.key;
    EXPECT_TRUE(TensorsEqual(*t, item.value))
        << item.key << ": " << t->DebugString() << " vs "
        << item.value.DebugString();
  }
}

}  // namespace modelstate::testing

#endif  // MODELSTATE_TESTS_TESTING_TENSORS_H_

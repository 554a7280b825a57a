// File: tensors.h
// Test helpers for making tensors in one line and comparing state dicts.
//
// Example:
//   Tensor w = Filled(DType::kFloat32, {2, 3}, 0.5);
//   ExpectSameState(client_state, local_module->GetStateDict());
#ifndef MODELSTATE_TESTS_TESTING_TENSORS_H_
#define MODELSTATE_TESTS_TESTING_TENSORS_H_

#include <cstdint>
#include <random>
#include <string>
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

// A cpu tensor of `count` elements of random bits (bool: 0 or 1).
inline Tensor RandomTensor(DType dtype, int64_t count, uint64_t seed = 1) {
  std::mt19937_64 random(seed);
  std::string bytes(static_cast<size_t>(count) * ElementSize(dtype), '\0');
  for (char& c : bytes) {
    c = static_cast<char>(dtype == DType::kBool ? random() & 1 : random());
  }
  absl::StatusOr<Tensor> t = Tensor::FromBytes(dtype, {count}, bytes);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : Tensor();
}

// A tensor's bytes, copied to the host from whatever device holds them.
inline std::string HostBytes(const Tensor& t) {
  absl::StatusOr<Tensor> host = t.To(Device::Cpu(), t.dtype());
  EXPECT_TRUE(host.ok()) << host.status();
  if (!host.ok()) return "";
  return std::string(static_cast<const char*>(host->raw_data()),
                     host->nbytes());
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

// The vectorised float32 activations and softmax against double-precision
// references, and their special values. On this project's machines the
// AVX2 path runs; the libm fallback (CPUs without AVX2) meets the same
// bounds.
#include "nn/kernels/vector_math.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace modelstate::internal {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Every float step of 1/1024 in [lo, hi] (the length is rarely a multiple of
// 8, so the masked tail runs too).
std::vector<float> Grid(float lo, float hi) {
  std::vector<float> xs;
  for (float x = lo; x <= hi; x += 1.0f / 1024) xs.push_back(x);
  return xs;
}

// max over the grid of |ours - ref| / max(|ref|, floor).
double MaxError(void (*kernel)(float*, int64_t), double (*ref)(double),
                const std::vector<float>& xs, double floor) {
  std::vector<float> ys = xs;
  kernel(ys.data(), static_cast<int64_t>(ys.size()));
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double r = ref(xs[i]);
    worst = std::max(worst, std::abs(ys[i] - r) / std::max(std::abs(r), floor));
  }
  return worst;
}

double GeluRef(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double GeluTanhRef(double x) {
  const double u = std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x);
  return x / (1 + std::exp(-2 * u));
}
double SiluRef(double x) { return x / (1 + std::exp(-x)); }
double SigmoidRef(double x) { return 1 / (1 + std::exp(-x)); }

TEST(VectorMathTest, ExpIsAccurateIntoTheSubnormalsAndOverflows) {
  // Relative error of a few ulps where the result is a normal float.
  EXPECT_LT(
      MaxError(
          ExpInPlace, [](double x) { return std::exp(x); }, Grid(-87, 88.5), 0),
      4e-7);
  std::vector<float> v = {-kInf, -200, -104, -100, 0, 88.8f, 200, kInf};
  ExpInPlace(v.data(), static_cast<int64_t>(v.size()));
  EXPECT_EQ(v[0], 0.0f);  // masked attention scores must vanish exactly
  EXPECT_EQ(v[1], 0.0f);
  EXPECT_EQ(v[2], 0.0f);
  EXPECT_GT(v[3], 0.0f);  // exp(-100) = 3.7e-44 is a subnormal
  EXPECT_NEAR(v[3], std::exp(-100.0), 2e-45);
  EXPECT_EQ(v[4], 1.0f);
  EXPECT_EQ(v[5], kInf);
  EXPECT_EQ(v[6], kInf);
  EXPECT_EQ(v[7], kInf);
  std::vector<float> nan = {std::nanf("")};
  ExpInPlace(nan.data(), 1);
  EXPECT_TRUE(std::isnan(nan[0]));
}

TEST(VectorMathTest, ActivationsMatchDoublePrecision) {
  // Errors relative to max(|ref|, 1e-3): far in the negative tails the
  // results are below 1e-3 and only their absolute error matters.
  const std::vector<float> xs = Grid(-12, 12);
  // (5e-7 on the vector path; libm's erfc of the rounded x / sqrt 2 makes
  // 9e-7.)
  EXPECT_LT(MaxError(GeluErfInPlace, GeluRef, xs, 1e-3), 1e-6);
  // The tanh form's argument u = k (x + 0.044715 x^3) is itself rounded in
  // float, and exp(-2u) turns that into a few times more relative error in
  // the tail, as for any float evaluation of the formula.
  EXPECT_LT(MaxError(GeluTanhInPlace, GeluTanhRef, xs, 1e-3), 2e-6);
  EXPECT_LT(MaxError(SiluInPlace, SiluRef, xs, 1e-3), 5e-7);
  EXPECT_LT(MaxError(SigmoidInPlace, SigmoidRef, xs, 1e-6), 5e-7);
  // Near zero the results are relatively accurate too.
  const std::vector<float> small = Grid(-0.125f, 0.125f);
  EXPECT_LT(MaxError(GeluErfInPlace, GeluRef, small, 0), 5e-7);
  EXPECT_LT(MaxError(SiluInPlace, SiluRef, small, 0), 5e-7);
}

TEST(VectorMathTest, ActivationsOfInfinitiesAndNaNAreThoseOfTheFormulas) {
  std::vector<float> gelu = {-kInf, kInf, -50, std::nanf("")};
  GeluErfInPlace(gelu.data(), 4);
  // 0.5 * -inf * (1 + erf(-inf)) = -inf * 0, NaN in PyTorch as well.
  EXPECT_TRUE(std::isnan(gelu[0]));
  EXPECT_EQ(gelu[1], kInf);
  EXPECT_EQ(gelu[2], 0.0f);
  EXPECT_TRUE(std::isnan(gelu[3]));

  std::vector<float> silu = {-kInf, kInf, -200, std::nanf("")};
  SiluInPlace(silu.data(), 4);
  EXPECT_TRUE(std::isnan(silu[0]));
  EXPECT_EQ(silu[1], kInf);
  EXPECT_EQ(silu[2], 0.0f);
  EXPECT_TRUE(std::isnan(silu[3]));

  std::vector<float> sigmoid = {-kInf, kInf, std::nanf("")};
  SigmoidInPlace(sigmoid.data(), 3);
  EXPECT_EQ(sigmoid[0], 0.0f);
  EXPECT_EQ(sigmoid[1], 1.0f);
  EXPECT_TRUE(std::isnan(sigmoid[2]));
}

TEST(VectorMathTest, SoftmaxRowsMatchDoublePrecisionAndZeroMaskedKeys) {
  for (int64_t n : {1, 5, 8, 13, 64, 1000}) {
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      row[i] = 3 * std::sin(0.7f * static_cast<float>(i));
    }
    if (n > 2) row[n - 1] = row[1] = -kInf;
    std::vector<double> ref(row.begin(), row.end());
    double max = -INFINITY, sum = 0;
    for (double v : ref) max = std::max(max, v);
    for (double& v : ref) sum += (v = std::exp(v - max));
    SoftmaxRowInPlace(row.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " i=" << i);
      if (ref[i] == 0) {
        EXPECT_EQ(row[i], 0.0f);
      } else {
        EXPECT_NEAR(row[i], ref[i] / sum, 2e-6 * ref[i] / sum);
      }
    }
  }
}

TEST(VectorMathTest, SoftmaxRowsWithoutAFiniteMaximumAreNaN) {
  std::vector<std::vector<float>> rows = {
      std::vector<float>(11, -kInf),
      {1, 2, 3, 4, 5, 6, 7, 8, std::nanf("")},
      {std::nanf(""), 1, 2},
      {1, kInf, 3},
  };
  for (std::vector<float>& row : rows) {
    SoftmaxRowInPlace(row.data(), static_cast<int64_t>(row.size()));
    for (float v : row) EXPECT_TRUE(std::isnan(v));
  }
}

TEST(VectorMathTest, MaxAbsSeesEveryElementAndNaN) {
  for (int64_t n : {0, 1, 7, 8, 9, 30}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = 0.5f * static_cast<float>(i % 5);
    if (n > 0) v[n - 1] = -9.0f;  // the last one, in the masked tail or not
    EXPECT_EQ(MaxAbs(v.data(), n), n > 0 ? 9.0f : 0.0f) << "n=" << n;
    if (n > 0) {
      v[0] = std::nanf("");
      EXPECT_EQ(MaxAbs(v.data(), n), kInf) << "n=" << n;
    }
  }
  std::vector<float> inf = {1, -kInf, 2};
  EXPECT_EQ(MaxAbs(inf.data(), 3), kInf);
}

}  // namespace
}  // namespace modelstate::internal

// File: generator_test.cc
// Checks Generator against PyTorch 1.13 bit for bit: the vectors recorded by
// make_generator_vectors.py (uniform_/normal_ for every floating dtype, many
// sizes and seeds, and sequences on one generator), std::mt19937 for the raw
// draws, and the repository's golden init values.
#include "core/generator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace modelstate {
namespace {

using nlohmann::json;

json LoadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return json::parse(in);
}

// dtype.cc is not linked here, so the few facts we need are spelled out.
DType DTypeFromName(const std::string& name) {
  if (name == "float32") return DType::kFloat32;
  if (name == "float64") return DType::kFloat64;
  if (name == "float16") return DType::kFloat16;
  if (name == "bfloat16") return DType::kBFloat16;
  ADD_FAILURE() << "unknown dtype " << name;
  return DType::kFloat32;
}

size_t BytesPerElement(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
      return 8;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    default:
      return 4;
  }
}

// The bits of element `index` as lower-case hex, 2 digits per byte, most
// significant first (what the script writes).
std::string ElementHex(const std::vector<uint8_t>& bytes, size_t width,
                       size_t index) {
  uint64_t value = 0;
  std::memcpy(&value, bytes.data() + index * width, width);  // little-endian
  char buffer[17];
  std::snprintf(buffer, sizeof(buffer), "%0*llx", static_cast<int>(2 * width),
                static_cast<unsigned long long>(value));
  return buffer;
}

uint64_t Fnv1a64(const std::vector<uint8_t>& bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (uint8_t byte : bytes) {
    hash ^= byte;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

std::string Hex64(uint64_t value) {
  char buffer[17];
  std::snprintf(buffer, sizeof(buffer), "%016llx",
                static_cast<unsigned long long>(value));
  return buffer;
}

const json& Vectors() {
  static const json* vectors = new json(LoadJson(
      std::string(MODELSTATE_TEST_DATA_DIR) + "/core/generator_vectors.json"));
  return *vectors;
}

// Replays every recorded case and compares each op's output bits.
void CheckAllVectors() {
  const json& cases = Vectors().at("cases");
  ASSERT_GT(cases.size(), 700u);
  for (const json& test_case : cases) {
    const std::string name = test_case.at("name").get<std::string>();
    SCOPED_TRACE(name);
    Generator gen(test_case.at("seed").get<uint64_t>());
    int op_index = 0;
    for (const json& op : test_case.at("ops")) {
      SCOPED_TRACE("op #" + std::to_string(op_index++));
      const DType dtype = DTypeFromName(op.at("dtype").get<std::string>());
      const int64_t count = op.at("count").get<int64_t>();
      const double a = op.at("a").get<double>();
      const double b = op.at("b").get<double>();
      const size_t width = BytesPerElement(dtype);
      std::vector<uint8_t> bytes(static_cast<size_t>(count) * width);
      if (op.at("op").get<std::string>() == "uniform") {
        gen.FillUniform(dtype, bytes.data(), count, a, b);
      } else {
        gen.FillNormal(dtype, bytes.data(), count, a, b);
      }
      if (op.contains("bits")) {
        std::string got;
        for (int64_t i = 0; i < count; ++i) {
          got += ElementHex(bytes, width, static_cast<size_t>(i));
        }
        // Compared as one string so a failure shows where it diverges.
        EXPECT_EQ(got, op.at("bits").get<std::string>());
      } else {
        EXPECT_EQ(Hex64(Fnv1a64(bytes)), op.at("fnv1a64").get<std::string>());
        for (const auto& [index, bits] : op.at("samples").items()) {
          EXPECT_EQ(ElementHex(bytes, width, std::stoul(index)),
                    bits.get<std::string>())
              << "element " << index;
        }
      }
    }
  }
}

TEST(GeneratorTest, MatchesTorchVectors) { CheckAllVectors(); }

// The portable kernels are what CPUs without AVX2/FMA run; they must give
// the same bits.
TEST(GeneratorTest, MatchesTorchVectorsWithPortableKernels) {
  generator_internal::ForcePortableKernelsForTesting(true);
  CheckAllVectors();
  generator_internal::ForcePortableKernelsForTesting(false);
}

TEST(GeneratorTest, VectorsComeFromPyTorchDefaultKernels) {
  const json& about = Vectors().at("_about");
  EXPECT_EQ(about.at("ATEN_CPU_CAPABILITY").get<std::string>(), "(unset)");
  EXPECT_TRUE(about.at("seed_uses_low_32_bits").get<bool>());
}

// at::mt19937 is the reference mt19937, so std::mt19937 predicts the raw
// 32-bit draws, across several 624-word blocks.
TEST(GeneratorTest, RandomMatchesStdMt19937) {
  for (uint32_t seed : {0u, 1u, 5489u, 0xffffffffu}) {
    SCOPED_TRACE(seed);
    Generator gen(seed);
    std::mt19937 reference(seed);
    for (int i = 0; i < 5000; ++i) {
      ASSERT_EQ(gen.Random(), reference()) << "draw " << i;
    }
  }
}

TEST(GeneratorTest, Random64PutsTheFirstDrawHigh) {
  Generator gen(42);
  std::mt19937 reference(42);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t hi = reference();
    const uint64_t lo = reference();
    ASSERT_EQ(gen.Random64(), (hi << 32) | lo) << "draw " << i;
  }
}

TEST(GeneratorTest, SeedKeepsLow32Bits) {
  Generator high((uint64_t{1} << 32) + 5);
  Generator low(5);
  for (int i = 0; i < 700; ++i) ASSERT_EQ(high.Random(), low.Random());
}

TEST(GeneratorTest, EmptyFillsDrawNothing) {
  Generator gen(3);
  Generator fresh(3);
  gen.FillUniform(DType::kFloat32, nullptr, 0, 0.0, 1.0);
  gen.FillNormal(DType::kFloat64, nullptr, 0, 0.0, 1.0);
  gen.FillNormal(DType::kBFloat16, nullptr, 0, 0.0, 1.0);
  EXPECT_EQ(gen.Random(), fresh.Random());
}

// torch/nn/init.py's kaiming_uniform_(w, a=sqrt(5)) bound, in double as
// Python computes it: gain = sqrt(2 / (1 + a ** 2)) (a ** 2 is not exactly 5),
// std = gain / sqrt(fan_in), bound = sqrt(3) * std.
double KaimingUniformBound(int fan_in) {
  const double a = std::sqrt(5.0);
  const double gain = std::sqrt(2.0 / (1 + std::pow(a, 2.0)));
  const double std_dev = gain / std::sqrt(static_cast<double>(fan_in));
  return std::sqrt(3.0) * std_dev;
}

// Linear.reset_parameters' bias bound.
double BiasBound(int fan_in) {
  return 1 / std::sqrt(static_cast<double>(fan_in));
}

std::vector<double> Flatten(const json& values) {
  std::vector<double> flat;
  if (values.is_array()) {
    for (const json& v : values) {
      for (double x : Flatten(v)) flat.push_back(x);
    }
  } else {
    flat.push_back(values.get<double>());
  }
  return flat;
}

std::vector<double> Widen(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

// The `cases` of the repository's golden init.json.
const json& GoldenInitCases() {
  static const json* golden =
      new json(LoadJson(std::string(MODELSTATE_GOLDEN_DIR) + "/init.json"));
  return golden->at("cases");
}

TEST(GeneratorTest, GoldenLinearWithoutBias) {
  Generator gen(0);
  std::vector<float> weight(2 * 3);
  const double bound = KaimingUniformBound(3);
  gen.FillUniform(DType::kFloat32, weight.data(), 6, -bound, bound);
  EXPECT_EQ(Widen(weight),
            Flatten(GoldenInitCases().at(
                "values: manual_seed(0); Linear(3,2,bias=False).weight")));
}

TEST(GeneratorTest, GoldenLinearWeightThenBias) {
  Generator gen(0);
  std::vector<float> weight(2 * 2);
  std::vector<float> bias(2);
  const double bound = KaimingUniformBound(2);
  gen.FillUniform(DType::kFloat32, weight.data(), 4, -bound, bound);
  gen.FillUniform(DType::kFloat32, bias.data(), 2, -BiasBound(2), BiasBound(2));
  const json& expected =
      GoldenInitCases().at("values: manual_seed(0); Linear(2,2)");
  EXPECT_EQ(Widen(weight), Flatten(expected.at("weight")));
  EXPECT_EQ(Widen(bias), Flatten(expected.at("bias")));
}

TEST(GeneratorTest, GoldenEmbeddingWithPaddingRow) {
  Generator gen(0);
  std::vector<float> weight(4 * 2);
  gen.FillNormal(DType::kFloat32, weight.data(), 8, 0.0, 1.0);
  weight[2] = weight[3] = 0.0f;  // padding_idx=1's row
  EXPECT_EQ(
      Widen(weight),
      Flatten(GoldenInitCases().at(
          "values: manual_seed(0); Embedding(4,2,padding_idx=1).weight")));
}

}  // namespace
}  // namespace modelstate

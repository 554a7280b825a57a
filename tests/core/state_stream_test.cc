#include "core/state_stream.h"

#include <random>
#include <string>
#include <vector>

#include "core/module_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/spec_json.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::SpecFromJson;
using ::modelstate::testing::StatusIs;
using ::testing::HasSubstr;

StateDict Sample() {
  BuildOptions o;
  o.hooks = nullptr;
  o.seed = 3;
  absl::StatusOr<BuildResult> built =
      BuildModule(SpecFromJson(R"({"type": "Net", "members": [
      {"module": {"name": "bn", "spec": {"type": "BatchNorm1d", "args": [5]}}},
      {"parameter": {"name": "empty", "shape": [0, 3]}},
      {"buffer": {"name": "scalar", "shape": [], "init": {"kind": "ones"}}},
      {"module": {"name": "fc", "spec": {"type": "Linear", "args": [33, 17]}}}]})"),
                  o);
  EXPECT_TRUE(built.ok()) << built.status();
  return built->root->GetStateDict();
}

// Streams `sd` through a reader and an assembler in chunks of random sizes.
absl::StatusOr<StateDict> RoundTrip(const StateDict& sd,
                                    std::optional<DType> target, int seed) {
  absl::StatusOr<std::unique_ptr<StateDictReader>> reader =
      StateDictReader::Create(sd, target);
  if (!reader.ok()) return reader.status();
  absl::StatusOr<std::unique_ptr<StateDictAssembler>> assembler =
      StateDictAssembler::Create((*reader)->layout(), StreamLimits{});
  if (!assembler.ok()) return assembler.status();
  std::mt19937 rng(seed);
  std::string chunk;
  while (true) {
    chunk.clear();
    absl::StatusOr<size_t> n = (*reader)->Read(1 + rng() % 37, &chunk);
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    absl::Status s = (*assembler)->Append(chunk);
    if (!s.ok()) return s;
  }
  return (*assembler)->Finish();
}

TEST(StateStreamTest, RoundTripsInArbitraryChunks) {
  StateDict sd = Sample();
  for (int seed = 0; seed < 5; ++seed) {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict back,
                                    RoundTrip(sd, std::nullopt, seed));
    ASSERT_EQ(back.tensors.Keys(), sd.tensors.Keys());
    for (const auto& item : sd.tensors) {
      EXPECT_TRUE(TensorsEqual(*back.tensors.Find(item.key), item.value))
          << item.key;
    }
    ASSERT_TRUE(back.metadata.has_value());
    EXPECT_EQ(back.metadata->Keys(), sd.metadata->Keys());
  }
}

TEST(StateStreamTest, ConvertsFloatingEntriesOnTheFly) {
  StateDict sd = Sample();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict half,
                                  RoundTrip(sd, DType::kFloat16, 9));
  for (const auto& item : sd.tensors) {
    const Tensor& got = *half.tensors.Find(item.key);
    DType want = IsFloatingPoint(item.value.dtype()) ? DType::kFloat16
                                                     : item.value.dtype();
    MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor expected,
                                    item.value.To(Device::Cpu(), want));
    EXPECT_TRUE(TensorsEqual(got, expected)) << item.key;
  }
  EXPECT_THAT(
      StateDictReader::Create(sd, DType::kInt8),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("floating")));
}

TEST(StateStreamTest, TruncatedAndOverlongStreamsAreRejected) {
  StateDict sd = Sample();
  StateDictLayout layout = LayoutOf(sd);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto a,
                                  StateDictAssembler::Create(layout, {}));
  ASSERT_TRUE(a->Append(std::string(10, 'x')).ok());
  EXPECT_THAT(a->Finish(), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("ended after 10 of")));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto b,
                                  StateDictAssembler::Create(layout, {}));
  EXPECT_THAT(
      b->Append(std::string(layout.total_bytes + 1, 'x')),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more than")));
}

TEST(StateStreamTest, LayoutsAreValidated) {
  StateDictLayout base = LayoutOf(Sample());
  auto with = [&](auto edit) {
    StateDictLayout l = base;
    edit(l);
    return StateDictAssembler::Create(l, StreamLimits{}).status();
  };
  EXPECT_THAT(with([](StateDictLayout& l) { l.entries[0].key = ""; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "header.entries[0].key is empty"));
  EXPECT_THAT(
      with([](StateDictLayout& l) { l.entries[1].key = l.entries[0].key; }),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("appears twice")));
  EXPECT_THAT(with([](StateDictLayout& l) { l.entries[0].shape = {-1}; }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("negative dimension")));
  EXPECT_THAT(
      with([](StateDictLayout& l) { l.entries[0].nbytes += 4; }),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("byte_length")));
  EXPECT_THAT(
      with([](StateDictLayout& l) { l.total_bytes += 1; }),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("total_bytes")));
  EXPECT_THAT(with([](StateDictLayout& l) {
                l.entries[0].shape = {int64_t{1} << 40, int64_t{1} << 40};
              }),
              StatusIs(absl::StatusCode::kInvalidArgument));
  StreamLimits small;
  small.max_tensor_bytes = 16;
  EXPECT_THAT(StateDictAssembler::Create(base, small),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_tensor_bytes")));
  small = {};
  small.max_total_bytes = 100;
  EXPECT_THAT(StateDictAssembler::Create(base, small),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_total_bytes")));
  small = {};
  small.max_entries = 2;
  EXPECT_THAT(StateDictAssembler::Create(base, small),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(StateStreamTest, MetaEntriesHaveNoBytesToRead) {
  StateDict sd;
  sd.tensors.Set("m", *Tensor::Empty(DType::kFloat32, {4}, Device::Meta()));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto reader,
                                  StateDictReader::Create(sd, std::nullopt));
  EXPECT_EQ(reader->layout().total_bytes, 16u);
  std::string out;
  EXPECT_THAT(
      reader->Read(100, &out),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("meta")));
}

}  // namespace
}  // namespace modelstate

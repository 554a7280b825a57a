#include "core/state_stream.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/staged_state_dict.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/module_spec.h"
#include "tests/testing/spec_json.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::IsOk;
using ::modelstate::testing::SpecFromJson;
using ::modelstate::testing::StatusIs;
using ::testing::HasSubstr;

StateDict Sample(uint64_t seed = 3) {
  BuildOptions o;
  o.hooks = nullptr;
  o.seed = seed;
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

// Streams `reader` into `assembler`, alternating Appends with bytes put
// where PlaceAll said (as a server on the same host does) when `place`.
void Feed(StateDictReader& reader, StateDictAssembler& assembler, bool place) {
  std::vector<absl::Span<char>> where;
  if (place) {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(where, assembler.PlaceAll());
  }
  for (int round = 0; reader.remaining() > 0; ++round) {
    if (!place || round % 2 == 0) {
      std::string chunk;
      MODELSTATE_ASSERT_OK_AND_ASSIGN(size_t n, reader.Read(13, &chunk));
      ASSERT_THAT(assembler.Append(chunk), IsOk());
      ASSERT_EQ(n, chunk.size());
      continue;
    }
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        size_t n, reader.ReadTo(29, [&](absl::string_view piece) {
          const auto [entry, offset] = reader.NextByte();
          EXPECT_LE(offset + piece.size(), where[entry].size());
          std::memcpy(where[entry].data() + offset, piece.data(), piece.size());
          return absl::OkStatus();
        }));
    ASSERT_THAT(assembler.Placed(n), IsOk());
  }
}

// A writer that puts the bytes where PlaceAll said (as a server on the
// same host does), alternating with ordinary Appends, gets the same state.
TEST(StateStreamTest, PlacedBytesMixWithAppendedOnes) {
  StateDict sd = Sample();
  for (std::optional<DType> target :
       {std::optional<DType>(), std::optional<DType>(DType::kFloat16)}) {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(auto reader,
                                    StateDictReader::Create(sd, target));
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        auto assembler, StateDictAssembler::Create(reader->layout(), {}));
    Feed(*reader, *assembler, /*place=*/true);
    MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict back, assembler->Finish());
    ASSERT_EQ(back.tensors.Keys(), sd.tensors.Keys());
    for (const auto& item : sd.tensors) {
      MODELSTATE_ASSERT_OK_AND_ASSIGN(
          Tensor want, item.value.To(Device::Cpu(),
                                     target.has_value() &&
                                             IsFloatingPoint(item.value.dtype())
                                         ? *target
                                         : item.value.dtype()));
      EXPECT_TRUE(TensorsEqual(*back.tensors.Find(item.key), want)) << item.key;
    }
  }
}

// Refreshing a replica: the bytes land in the caller's own tensor objects
// and memory, which keep their identity; other keys are left alone, and a
// tensor sharing its storage with another gets its own (copy on write).
TEST(StateStreamTest, CreateIntoOverwritesTheCallersTensorsInPlace) {
  const StateDict sd = Sample();
  for (bool place : {false, true}) {
    SCOPED_TRACE(place ? "placed" : "appended");
    StateDict into;
    for (const auto& item : Sample(/*seed=*/11).tensors) {
      MODELSTATE_ASSERT_OK_AND_ASSIGN(Tensor own, item.value.Clone());
      into.tensors.Set(item.key, own);
    }
    ASSERT_FALSE(TensorsEqual(*into.tensors.Find("fc.weight"),
                              *sd.tensors.Find("fc.weight")));
    const Tensor extra = *Tensor::Full(DType::kInt64, {2}, 5.0);
    into.tensors.Set("extra", extra);
    // A second tensor object over fc.bias's storage must keep its values.
    Tensor& bias = *into.tensors.Find("fc.bias");
    const Tensor sharing = bias.Detach();
    MODELSTATE_ASSERT_OK_AND_ASSIGN(const Tensor old_bias, bias.Clone());
    std::vector<Tensor> handles;
    std::vector<const void*> memory;
    for (const auto& item : into.tensors) {
      handles.push_back(item.value);
      memory.push_back(item.value.raw_data());
    }
    MODELSTATE_ASSERT_OK_AND_ASSIGN(auto reader,
                                    StateDictReader::Create(sd, std::nullopt));
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        auto assembler,
        StateDictAssembler::CreateInto(reader->layout(), {}, into));
    Feed(*reader, *assembler, place);
    MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict back, assembler->Finish());
    ASSERT_EQ(back.tensors.Keys(), sd.tensors.Keys());
    size_t i = 0;
    for (const auto& item : into.tensors) {
      const Tensor* want = sd.tensors.Find(item.key);
      EXPECT_TRUE(item.value.is_same(handles[i])) << item.key;
      if (want == nullptr) {
        EXPECT_TRUE(TensorsEqual(item.value, extra));
      } else {
        EXPECT_TRUE(TensorsEqual(item.value, *want)) << item.key;
        EXPECT_TRUE(back.tensors.Find(item.key)->is_same(item.value));
        if (item.key != "fc.bias") {
          EXPECT_EQ(item.value.raw_data(), memory[i]) << item.key;
        }
      }
      ++i;
    }
    EXPECT_TRUE(TensorsEqual(sharing, old_bias));
    EXPECT_FALSE(bias.SharesStorageWith(sharing));
  }
}

TEST(StateStreamTest, CreateIntoRefusesTargetsThatDoNotFit) {
  const StateDict sd = Sample();
  const StateDictLayout layout = LayoutOf(sd);
  auto into_with = [&](auto edit) {
    StateDict into;
    for (const auto& item : sd.tensors) {
      into.tensors.Set(item.key, *item.value.Clone());
    }
    edit(into);
    return StateDictAssembler::CreateInto(layout, {}, into).status();
  };
  EXPECT_THAT(into_with([](StateDict&) {}), IsOk());
  EXPECT_THAT(into_with([](StateDict& d) { d.tensors.Erase("fc.bias"); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "into: no tensor for 'fc.bias', which the fetched "
                       "state_dict has"));
  EXPECT_THAT(into_with([](StateDict& d) {
                d.tensors.Set("fc.bias", *Tensor::Empty(DType::kFloat16, {17}));
              }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "into['fc.bias']: float16 [17], but the fetched entry "
                       "is float32 [17]"));
  EXPECT_THAT(into_with([](StateDict& d) {
                d.tensors.Set("fc.bias", *Tensor::Empty(DType::kFloat32, {18}));
              }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("float32 [18], but")));
  EXPECT_THAT(into_with([](StateDict& d) {
                d.tensors.Set("fc.bias", *Tensor::Empty(DType::kFloat32, {17},
                                                        Device::Meta()));
              }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("into['fc.bias']: on meta")));
  // The layout is validated as by Create.
  StateDictLayout bad = layout;
  bad.total_bytes += 1;
  EXPECT_THAT(
      StateDictAssembler::CreateInto(bad, {}, sd).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("total_bytes")));
}

TEST(StateStreamTest, APieceTheTakerRefusesIsNotRead) {
  StateDict sd = Sample();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto reader,
                                  StateDictReader::Create(sd, std::nullopt));
  const uint64_t total = reader->remaining();
  int calls = 0;
  EXPECT_THAT(reader->ReadTo(1 << 20,
                             [&](absl::string_view) {
                               return ++calls == 2
                                          ? absl::DataLossError("refused")
                                          : absl::OkStatus();
                             }),
              StatusIs(absl::StatusCode::kDataLoss, "refused"));
  // The first entry with bytes was taken, the second was not.
  const std::vector<StateDictLayoutEntry>& entries = reader->layout().entries;
  std::vector<size_t> with_bytes;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].nbytes > 0) with_bytes.push_back(i);
  }
  ASSERT_GE(with_bytes.size(), 2u);
  EXPECT_EQ(reader->remaining(), total - entries[with_bytes[0]].nbytes);
  EXPECT_EQ(reader->NextByte(),
            (std::pair<size_t, uint64_t>(with_bytes[1], 0)));
}

TEST(StateStreamTest, PlacingNeedsPlaceAllFirst) {
  StateDictLayout layout = LayoutOf(Sample());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto a,
                                  StateDictAssembler::Create(layout, {}));
  EXPECT_THAT(a->Placed(4), StatusIs(absl::StatusCode::kFailedPrecondition,
                                     HasSubstr("PlaceAll")));
  ASSERT_THAT(a->Append(std::string(4, 'x')), IsOk());
  EXPECT_THAT(a->PlaceAll(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                      HasSubstr("received already")));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto b,
                                  StateDictAssembler::Create(layout, {}));
  ASSERT_THAT(b->PlaceAll().status(), IsOk());
  EXPECT_THAT(
      b->Placed(layout.total_bytes + 1),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more than")));
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
  // torch loads a state_dict with an empty key (an unexpected one).
  MODELSTATE_EXPECT_OK(with([](StateDictLayout& l) { l.entries[0].key = ""; }));
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

namespace modelstate {
namespace {

// A module like Sample()'s, built with another seed, to load into.
std::shared_ptr<Module> SampleModule(uint64_t seed, DType dtype) {
  BuildOptions o;
  o.hooks = nullptr;
  o.seed = seed;
  o.dtype = dtype;
  absl::StatusOr<BuildResult> built =
      BuildModule(SpecFromJson(R"({"type": "Net", "members": [
      {"module": {"name": "bn", "spec": {"type": "BatchNorm1d", "args": [5]}}},
      {"parameter": {"name": "empty", "shape": [0, 3]}},
      {"buffer": {"name": "scalar", "shape": [], "init": {"kind": "ones"}}},
      {"module": {"name": "fc", "spec": {"type": "Linear", "args": [33, 17]}}}]})"),
                  o);
  EXPECT_TRUE(built.ok()) << built.status();
  return built->root;
}

class StagedStateDictTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("staged_", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // `sd` streamed (as `wire` dtype for floating entries) into a staged
  // state_dict in chunks of random sizes.
  std::unique_ptr<StagedStateDict> Stage(const StateDict& sd,
                                         std::optional<DType> wire) {
    auto reader = StateDictReader::Create(sd, wire);
    EXPECT_TRUE(reader.ok()) << reader.status();
    auto staged = StagedStateDict::CreateAnonymous(
        (*reader)->layout(), StreamLimits{}, dir_.string());
    EXPECT_TRUE(staged.ok()) << staged.status();
    std::mt19937 rng(7);
    std::string chunk;
    while (true) {
      chunk.clear();
      absl::StatusOr<size_t> n = (*reader)->Read(1 + rng() % 1000, &chunk);
      EXPECT_TRUE(n.ok());
      if (!n.ok() || *n == 0) break;
      EXPECT_THAT((*staged)->Append(chunk), IsOk());
    }
    return std::move(*staged);
  }

  std::filesystem::path dir_;
};

TEST_F(StagedStateDictTest, LoadsExactlyAsTheSameStateDictInMemory) {
  const StateDict sd = SampleModule(3, DType::kFloat32)->GetStateDict();
  for (std::optional<DType> wire :
       {std::optional<DType>(), std::optional<DType>(DType::kFloat16),
        std::optional<DType>(DType::kFloat64)}) {
    SCOPED_TRACE(wire.has_value() ? DTypeName(*wire) : "as is");
    std::unique_ptr<StagedStateDict> staged = Stage(sd, wire);
    // Nothing is left in the directory: the staging file is unlinked.
    EXPECT_TRUE(std::filesystem::is_empty(dir_));
    MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict described, staged->Finish());
    for (const auto& item : described.tensors) {
      EXPECT_TRUE(item.value.device().is_meta()) << item.key;
    }
    // The reference: the same bytes assembled in memory.
    StateDict in_memory = *RoundTrip(sd, wire, 1);
    std::shared_ptr<Module> want = SampleModule(9, DType::kFloat32);
    ASSERT_THAT(want->LoadStateDict(in_memory), IsOk());
    std::shared_ptr<Module> got = SampleModule(9, DType::kFloat32);
    LoadOptions options;
    options.source = staged.get();
    ASSERT_THAT(got->LoadStateDict(described, options), IsOk());
    StateDict a = got->GetStateDict();
    StateDict b = want->GetStateDict();
    ASSERT_EQ(a.tensors.Keys(), b.tensors.Keys());
    for (const auto& item : b.tensors) {
      EXPECT_TRUE(TensorsEqual(*a.tensors.Find(item.key), item.value))
          << item.key;
    }
  }
}

TEST_F(StagedStateDictTest, ErrorsAreTheInMemoryOnes) {
  const StateDict sd = SampleModule(3, DType::kFloat32)->GetStateDict();
  std::unique_ptr<StagedStateDict> staged = Stage(sd, std::nullopt);
  EXPECT_THAT(staged->Append("x"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("received more than the")));
  // A module with other shapes fails with PyTorch's text and keeps its
  // values (atomic).
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict described, staged->Finish());
  BuildOptions o;
  o.hooks = nullptr;
  auto other = BuildModule(SpecFromJson(R"({"type": "Net", "members": [
      {"module": {"name": "fc", "spec": {"type": "Linear", "args": [3, 17]}}}]})"),
                           o);
  ASSERT_TRUE(other.ok());
  StateDict before = other->root->GetStateDict();
  LoadOptions options;
  options.source = staged.get();
  options.strict = false;
  EXPECT_THAT(other->root->LoadStateDict(described, options),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("size mismatch for fc.weight: copying a "
                                 "param with shape torch.Size([17, 33])")));
  EXPECT_TRUE(TensorsEqual(*other->root->GetStateDict().tensors.Find("fc.bias"),
                           *before.tensors.Find("fc.bias")));
  // A stream cut short says how much arrived.
  auto reader = StateDictReader::Create(sd, std::nullopt);
  ASSERT_TRUE(reader.ok());
  auto short_stream = StagedStateDict::CreateAnonymous(
      (*reader)->layout(), StreamLimits{}, dir_.string());
  ASSERT_TRUE(short_stream.ok());
  ASSERT_THAT((*short_stream)->Append("abc"), IsOk());
  EXPECT_THAT((*short_stream)->Finish(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the stream ended after 3 of")));
  EXPECT_THAT(
      StagedStateDict::CreateAnonymous((*reader)->layout(), StreamLimits{},
                                       (dir_ / "missing").string()),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing")));
}

// The observer sees exactly the stream, in order, on its own thread, and
// the staged bytes are what they would be without it.
TEST_F(StagedStateDictTest, ObserverSeesTheWholeStreamInOrder) {
  const StateDict sd = SampleModule(3, DType::kFloat32)->GetStateDict();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto reader,
                                  StateDictReader::Create(sd, std::nullopt));
  std::string stream;
  std::string chunk;
  while (true) {
    chunk.clear();
    MODELSTATE_ASSERT_OK_AND_ASSIGN(size_t n, reader->Read(777, &chunk));
    if (n == 0) break;
    stream += chunk;
  }
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      auto staged, StagedStateDict::CreateAnonymous(
                       reader->layout(), StreamLimits{}, dir_.string()));
  std::string seen;
  const std::thread::id appending = std::this_thread::get_id();
  std::atomic<bool> on_appending_thread{false};
  ASSERT_THAT(staged->Observe([&](absl::string_view bytes) {
    if (std::this_thread::get_id() == appending) on_appending_thread = true;
    seen.append(bytes.data(), bytes.size());
  }),
              IsOk());
  EXPECT_THAT(staged->Observe([](absl::string_view) {}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("set once, before the first bytes")));
  std::mt19937 rng(11);
  for (size_t at = 0; at < stream.size();) {
    const size_t n = std::min<size_t>(1 + rng() % 5000, stream.size() - at);
    ASSERT_THAT(staged->Append(stream.substr(at, n)), IsOk());
    at += n;
  }
  ASSERT_THAT(staged->Drain(), IsOk());
  EXPECT_EQ(seen.size(), stream.size());
  EXPECT_TRUE(seen == stream);
  EXPECT_FALSE(on_appending_thread);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict described, staged->Finish());
  std::shared_ptr<Module> got = SampleModule(9, DType::kFloat32);
  LoadOptions options;
  options.source = staged.get();
  ASSERT_THAT(got->LoadStateDict(described, options), IsOk());
  for (const auto& item : sd.tensors) {
    EXPECT_TRUE(
        TensorsEqual(*got->GetStateDict().tensors.Find(item.key), item.value))
        << item.key;
  }
  // After bytes arrived, an observer would miss them.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      auto late, StagedStateDict::CreateAnonymous(
                     reader->layout(), StreamLimits{}, dir_.string()));
  ASSERT_THAT(late->Append("abc"), IsOk());
  EXPECT_THAT(late->Observe([](absl::string_view) {}),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

// A load that is abandoned (the client went away) does not wait for a
// slow observer to work through what was queued.
TEST_F(StagedStateDictTest, AbandonedStreamStopsItsObserver) {
  const StateDict sd = SampleModule(3, DType::kFloat32)->GetStateDict();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto reader,
                                  StateDictReader::Create(sd, std::nullopt));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      auto staged, StagedStateDict::CreateAnonymous(
                       reader->layout(), StreamLimits{}, dir_.string()));
  std::atomic<int> observed{0};
  ASSERT_THAT(staged->Observe([&](absl::string_view) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ++observed;
  }),
              IsOk());
  constexpr int kPieces = 100;
  for (int i = 0; i < kPieces; ++i) ASSERT_THAT(staged->Append("x"), IsOk());
  staged.reset();
  // 100 pieces would take the observer 2 s; it stopped after its current
  // one.
  EXPECT_LT(observed.load(), kPieces / 2);
}

}  // namespace
}  // namespace modelstate

#include "core/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace modelstate {
namespace {

using ::modelstate::testing::ExpectSameState;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

std::string Le64(uint64_t value) {
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
  return out;
}

// A safetensors file: length prefix, `json` as is (no padding), `data`.
std::string MakeFile(const std::string& json, const std::string& data = "") {
  return Le64(json.size()) + json + data;
}

// A tensor whose bytes are a pattern that differs per `seed`.
Tensor Pattern(DType dtype, Shape shape, int seed) {
  absl::StatusOr<Tensor> t = Tensor::Empty(dtype, std::move(shape));
  EXPECT_TRUE(t.ok()) << t.status();
  absl::StatusOr<void*> data = t->MutableDataForOverwrite();
  EXPECT_TRUE(data.ok()) << data.status();
  auto* bytes = static_cast<unsigned char*>(*data);
  for (size_t i = 0; i < t->nbytes(); ++i) {
    bytes[i] = static_cast<unsigned char>(i * 37 + seed * 11 + 5);
  }
  if (dtype == DType::kBool) {
    for (size_t i = 0; i < t->nbytes(); ++i) bytes[i] &= 1;
  }
  return *t;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info =
        ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = absl::StrCat(::testing::TempDir(), "/safetensors_test.", getpid(),
                        ".", info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const {
    return absl::StrCat(dir_, "/", name);
  }

  std::string WriteRaw(const std::string& name, const std::string& bytes) {
    std::string path = Path(name);
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  // Names of the files in the test directory.
  std::vector<std::string> Files() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
};

// A state_dict with every dtype, a 0-dim tensor and zero-element tensors, in
// an order that is neither alphabetical nor grouped by dtype.
StateDict SampleStateDict() {
  StateDict sd;
  int seed = 0;
  for (DType dtype : kAllDTypes) {
    sd.tensors.Set(absl::StrCat("z", kNumDTypes - seed, ".", DTypeName(dtype)),
                   Pattern(dtype, {2, 3}, seed));
    ++seed;
  }
  sd.tensors.Set("b.scalar", Pattern(DType::kFloat64, {}, 100));
  sd.tensors.Set("a.empty", Pattern(DType::kInt32, {0, 4}, 101));
  sd.tensors.Set("c.bool_scalar", Pattern(DType::kBool, {}, 102));
  sd.tensors.Set("a.empty2", Pattern(DType::kBFloat16, {3, 0}, 103));
  sd.tensors.Set("m.0.weight", Pattern(DType::kFloat16, {5, 1, 3}, 104));
  return sd;
}

void ExpectSameStateDict(const StateDict& got, const StateDict& want) {
  ExpectSameState(got, want);
  for (const auto& item : got.tensors)
    EXPECT_TRUE(item.value.device().is_cpu());
}

TEST_F(SafetensorsTest, RoundTripsEveryDTypeInKeyOrder) {
  StateDict sd = SampleStateDict();
  const std::string path = Path("model.safetensors");
  MODELSTATE_ASSERT_OK(
      WriteSafetensorsFile(path, sd, {{"format", "pt"}, {"b", "2"}}));
  EXPECT_THAT(Files(), ElementsAre("model.safetensors"));  // No temp file.

  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict back, ReadSafetensorsFile(path));
  ExpectSameStateDict(back, sd);
  EXPECT_FALSE(back.metadata.has_value());

  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict parsed,
                                  ParseSafetensors(ReadAll(path)));
  ExpectSameStateDict(parsed, sd);

  MODELSTATE_ASSERT_OK_AND_ASSIGN(SafetensorsHeader header,
                                  ReadSafetensorsHeader(path));
  EXPECT_THAT(header.metadata,
              ElementsAre(Pair("format", "pt"), Pair("b", "2")));
  EXPECT_EQ(header.data_start % 8, 0u);
  ASSERT_EQ(header.entries.size(), sd.tensors.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < header.entries.size(); ++i) {
    const SafetensorsEntry& e = header.entries[i];
    const Tensor& t = sd.tensors.at(i).value;
    EXPECT_EQ(e.key, sd.tensors.at(i).key);
    EXPECT_EQ(e.dtype, t.dtype());
    EXPECT_EQ(e.shape, t.shape());
    EXPECT_EQ(e.begin, offset);
    offset += t.nbytes();
    EXPECT_EQ(e.end, offset);
  }
  EXPECT_EQ(header.data_bytes, offset);
  EXPECT_EQ(header.data_start + header.data_bytes, ReadAll(path).size());
}

TEST_F(SafetensorsTest, OverwritesAnExistingFile) {
  const std::string path = Path("m.safetensors");
  WriteRaw("m.safetensors", "old contents");
  StateDict sd = SampleStateDict();
  MODELSTATE_ASSERT_OK(WriteSafetensorsFile(path, sd));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict back, ReadSafetensorsFile(path));
  ExpectSameStateDict(back, sd);
}

TEST_F(SafetensorsTest, EmptyStateDict) {
  const std::string path = Path("empty.safetensors");
  MODELSTATE_ASSERT_OK(WriteSafetensorsFile(path, StateDict{}));
  // The reference writer's bytes for an empty dict: "{}" padded to 8.
  EXPECT_EQ(ReadAll(path), Le64(8) + "{}      ");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict back, ReadSafetensorsFile(path));
  EXPECT_TRUE(back.tensors.empty());
}

// The reference library writes and reads an empty tensor name; a load
// stages torch's unexpected key "" in a file like this one.
TEST_F(SafetensorsTest, AnEmptyKeyRoundTrips) {
  StateDict sd;
  sd.tensors.Set("", Pattern(DType::kFloat32, {2}, 1));
  sd.tensors.Set("w", Pattern(DType::kInt64, {1}, 2));
  const std::string path = Path("empty_key.safetensors");
  MODELSTATE_ASSERT_OK(WriteSafetensorsFile(path, sd));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict back, ReadSafetensorsFile(path));
  ExpectSameStateDict(back, sd);
}

TEST_F(SafetensorsTest, SerializedHeaderLayout) {
  std::vector<SafetensorsEntry> entries(2);
  entries[0].key = "b";
  entries[0].dtype = DType::kFloat32;
  entries[0].shape = {2};
  entries[0].begin = 77;  // Ignored: offsets are recomputed.
  entries[1].key = "a";
  entries[1].dtype = DType::kBool;
  entries[1].shape = {};
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::string header, SerializeSafetensorsHeader(entries, {{"k", "v"}}));
  const std::string json =
      R"({"__metadata__":{"k":"v"},"b":{"dtype":"F32","shape":[2],)"
      R"("data_offsets":[0,8]},"a":{"dtype":"BOOL","shape":[],)"
      R"("data_offsets":[8,9]}})";
  std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  EXPECT_EQ(header, Le64(padded.size()) + padded);
  EXPECT_EQ(header.size() % 8, 0u);

  // The reference implementation's published bytes for one F32 [1, 2, 3]
  // tensor named "attn.0" and for empty tensors with metadata.
  std::vector<SafetensorsEntry> attn(1);
  attn[0].key = "attn.0";
  attn[0].dtype = DType::kFloat32;
  attn[0].shape = {1, 2, 3};
  MODELSTATE_ASSERT_OK_AND_ASSIGN(header, SerializeSafetensorsHeader(attn, {}));
  EXPECT_EQ(
      header,
      Le64(64) +
          R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      header, SerializeSafetensorsHeader({}, {{"framework", "pt"}}));
  EXPECT_EQ(header, Le64(40) + R"({"__metadata__":{"framework":"pt"}})" +
                        std::string(5, ' '));
}

TEST_F(SafetensorsTest, SerializeRejectsBadKeys) {
  SafetensorsEntry e;
  e.key = "w";
  e.shape = {1};
  SafetensorsEntry reserved = e;
  reserved.key = "__metadata__";
  SafetensorsEntry negative = e;
  negative.key = "neg";
  negative.shape = {2, -1};
  EXPECT_THAT(SerializeSafetensorsHeader({e, e}, {}),
              StatusIs(kInvalid, HasSubstr("duplicate tensor key 'w'")));
  EXPECT_THAT(SerializeSafetensorsHeader({reserved}, {}),
              StatusIs(kInvalid, HasSubstr("'__metadata__'")));
  EXPECT_THAT(SerializeSafetensorsHeader({negative}, {}),
              StatusIs(kInvalid, HasSubstr("tensor 'neg'")));
  EXPECT_THAT(SerializeSafetensorsHeader({e}, {{"k", "1"}, {"k", "2"}}),
              StatusIs(kInvalid, HasSubstr("duplicate metadata key 'k'")));
  SafetensorsEntry bad_utf8 = e;
  bad_utf8.key = "\xff";
  EXPECT_THAT(SerializeSafetensorsHeader({bad_utf8}, {}),
              StatusIs(kInvalid, HasSubstr("UTF-8")));
}

// Many tensors: the header is built and parsed in linear time, and the
// parsed entries keep the layout order.
TEST_F(SafetensorsTest, ManyTensorsKeepTheirOrder) {
  constexpr int kCount = 100000;
  std::vector<SafetensorsEntry> entries(kCount);
  for (int i = 0; i < kCount; ++i) {
    // Descending names, so that any sorting by key would show.
    entries[i].key = absl::StrCat("layers.", kCount - i, ".weight");
    entries[i].dtype = i % 3 == 0 ? DType::kUInt8 : DType::kFloat16;
    entries[i].shape = {i % 5};
  }
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::string header,
                                  SerializeSafetensorsHeader(entries, {}));
  uint64_t data_bytes = 0;
  for (const SafetensorsEntry& e : entries) {
    data_bytes += static_cast<uint64_t>(e.shape[0]) * ElementSize(e.dtype);
  }
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      SafetensorsHeader parsed,
      ParseSafetensorsHeader(header, header.size() + data_bytes));
  ASSERT_EQ(parsed.entries.size(), entries.size());
  for (int i = 0; i < kCount; ++i) {
    ASSERT_EQ(parsed.entries[i].key, entries[i].key) << i;
  }
}

TEST_F(SafetensorsTest, StreamingWriterAcceptsOddSizedPieces) {
  StateDict sd = SampleStateDict();
  std::vector<SafetensorsEntry> entries;
  std::string data;
  for (const auto& item : sd.tensors) {
    SafetensorsEntry e;
    e.key = item.key;
    e.dtype = item.value.dtype();
    e.shape = item.value.shape();
    entries.push_back(e);
    data.append(static_cast<const char*>(item.value.raw_data()),
                item.value.nbytes());
  }
  const std::string path = Path("stream.safetensors");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<SafetensorsFileWriter> writer,
      SafetensorsFileWriter::Open(path, entries, {{"x", "y"}}));
  EXPECT_FALSE(std::filesystem::exists(path));  // Only the temp file so far.
  size_t pos = 0;
  for (size_t piece = 1; pos < data.size(); piece += 2) {
    size_t n = std::min(piece, data.size() - pos);
    MODELSTATE_ASSERT_OK(
        writer->Append(absl::string_view(data).substr(pos, n)));
    pos += n;
  }
  MODELSTATE_ASSERT_OK(writer->Append(""));
  MODELSTATE_ASSERT_OK(writer->Finish());
  EXPECT_THAT(writer->Append("x"),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(writer->Finish(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  writer.reset();
  EXPECT_THAT(Files(), ElementsAre("stream.safetensors"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict back, ReadSafetensorsFile(path));
  ExpectSameStateDict(back, sd);
}

std::vector<SafetensorsEntry> TwoFloats() {
  SafetensorsEntry a;
  a.key = "a";
  a.shape = {2};
  SafetensorsEntry b = a;
  b.key = "b";
  return {a, b};  // 16 data bytes.
}

TEST_F(SafetensorsTest, FinishRefusesTooFewBytes) {
  const std::string path = Path("short.safetensors");
  WriteRaw("short.safetensors", "previous");
  {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<SafetensorsFileWriter> writer,
        SafetensorsFileWriter::Open(path, TwoFloats()));
    MODELSTATE_ASSERT_OK(writer->Append(std::string(15, 'x')));
    EXPECT_THAT(
        writer->Finish(),
        StatusIs(absl::StatusCode::kFailedPrecondition,
                 AllOf(HasSubstr(path), HasSubstr("only 15 of the 16"))));
    EXPECT_EQ(Files().size(), 2u);  // The target and the temp file.
  }
  // The unfinished writer removed its temp file; the target is untouched.
  EXPECT_THAT(Files(), ElementsAre("short.safetensors"));
  EXPECT_EQ(ReadAll(path), "previous");
}

TEST_F(SafetensorsTest, AppendRefusesBytesBeyondTheLayout) {
  const std::string path = Path("long.safetensors");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<SafetensorsFileWriter> writer,
      SafetensorsFileWriter::Open(path, TwoFloats()));
  MODELSTATE_ASSERT_OK(writer->Append(std::string(10, '\1')));
  EXPECT_THAT(
      writer->Append(std::string(7, '\2')),
      StatusIs(kInvalid, AllOf(HasSubstr(path), HasSubstr("appending 7 bytes"),
                               HasSubstr("10 already written"))));
  // The refused piece was not written: the writer can still finish.
  MODELSTATE_ASSERT_OK(writer->Append(std::string(6, '\3')));
  MODELSTATE_ASSERT_OK(writer->Finish());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(SafetensorsHeader header,
                                  ReadSafetensorsHeader(path));
  std::string file = ReadAll(path);
  EXPECT_EQ(file.substr(header.data_start),
            std::string(10, '\1') + std::string(6, '\3'));
}

TEST_F(SafetensorsTest, OpenFailsInAMissingDirectory) {
  const std::string path = Path("no/such/dir/x.safetensors");
  EXPECT_THAT(SafetensorsFileWriter::Open(path, TwoFloats()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST_F(SafetensorsTest, WriteRejectsMetaAndUndefinedTensors) {
  StateDict sd;
  sd.tensors.Set("ok", Pattern(DType::kFloat32, {2}, 1));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      Tensor meta, Tensor::Empty(DType::kFloat32, {2}, Device::Meta()));
  sd.tensors.Set("on_meta", meta);
  const std::string path = Path("meta.safetensors");
  EXPECT_THAT(WriteSafetensorsFile(path, sd),
              StatusIs(kInvalid, AllOf(HasSubstr(path), HasSubstr("'on_meta'"),
                                       HasSubstr("meta"))));
  StateDict undefined;
  undefined.tensors.Set("none", Tensor());
  EXPECT_THAT(WriteSafetensorsFile(path, undefined),
              StatusIs(kInvalid, HasSubstr("'none'")));
  EXPECT_TRUE(Files().empty());
}

TEST_F(SafetensorsTest, AcceptsHeadersFromOtherWriters) {
  const std::string a_data("\x01\x02\x03\x04", 4);
  const std::string b_data("\x05\x06", 2);
  struct Case {
    const char* name;
    std::string json;
  };
  std::vector<Case> cases = {
      {"unpadded", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                   R"("b":{"dtype":"I8","shape":[1,2],"data_offsets":[4,6]}})"},
      {"whitespace and newlines",
       " \n{ \"a\" : {\"data_offsets\": [ 0 , 4 ], \"shape\": [4],"
       " \"dtype\": \"U8\"},\n\t\"b\": {\"dtype\": \"I8\", \"shape\": [1, 2],"
       " \"data_offsets\": [4, 6]}}\n        "},
      {"json order differs from data order, metadata last",
       R"({"b":{"dtype":"I8","shape":[1,2],"data_offsets":[4,6]},)"
       R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
       R"("__metadata__":{"format":"pt"}})"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        StateDict sd, ParseSafetensors(MakeFile(c.json, a_data + b_data)));
    ASSERT_THAT(sd.tensors.Keys(), ElementsAre("a", "b"));
    const Tensor& a = *sd.tensors.Find("a");
    const Tensor& b = *sd.tensors.Find("b");
    EXPECT_EQ(a.dtype(), DType::kUInt8);
    EXPECT_EQ(a.shape(), (Shape{4}));
    EXPECT_EQ(std::string(static_cast<const char*>(a.raw_data()), 4), a_data);
    EXPECT_EQ(b.dtype(), DType::kInt8);
    EXPECT_EQ(b.shape(), (Shape{1, 2}));
    EXPECT_EQ(std::string(static_cast<const char*>(b.raw_data()), 2), b_data);

    const std::string path =
        WriteRaw("other.safetensors", MakeFile(c.json, a_data + b_data));
    MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDict from_file,
                                    ReadSafetensorsFile(path));
    ExpectSameStateDict(from_file, sd);
  }
}

TEST_F(SafetensorsTest, ZeroByteTensorsSharingAnOffsetKeepKeyOrder) {
  const std::string json =
      R"({"z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
      R"("y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("x":{"dtype":"I64","shape":[0,5],"data_offsets":[4,4]},)"
      R"("w":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})";
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      SafetensorsHeader header,
      ParseSafetensorsHeader(MakeFile(json, "abcd"), json.size() + 12));
  std::vector<std::string> keys;
  for (const auto& e : header.entries) keys.push_back(e.key);
  EXPECT_THAT(keys, ElementsAre("w", "y", "z", "x"));
  EXPECT_EQ(header.data_start, 8 + json.size());
  EXPECT_EQ(header.data_bytes, 4u);
}

TEST_F(SafetensorsTest, ParseHeaderAsksForMoreWhenThePrefixIsShort) {
  const std::string json =
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  const std::string file = MakeFile(json, "x");
  EXPECT_THAT(ParseSafetensorsHeader(file.substr(0, 5), file.size()),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(ParseSafetensorsHeader(file.substr(0, 8), file.size()),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(
      ParseSafetensorsHeader(file.substr(0, 8 + json.size() - 1), file.size()),
      StatusIs(absl::StatusCode::kOutOfRange));
  MODELSTATE_EXPECT_OK(
      ParseSafetensorsHeader(file.substr(0, 8 + json.size()), file.size()));
  // A bad length is reported from the first 8 bytes alone.
  EXPECT_THAT(ParseSafetensorsHeader(Le64(1000), 100),
              StatusIs(kInvalid, HasSubstr("header length 1000")));
  EXPECT_THAT(ParseSafetensorsHeader(file, file.size() - 1),
              StatusIs(kInvalid, HasSubstr("longer than the file")));
}

struct BadFile {
  const char* name;
  std::string bytes;
  absl::StatusCode code;
  std::string message;
};

// One tensor "w" of F32 [2] (8 bytes) with `fields` replacing its object.
std::string OneTensor(const std::string& fields) {
  return absl::StrCat(R"({"w":)", fields, "}");
}

std::vector<BadFile> BadFiles() {
  const std::string ok_w =
      R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eight(8, '\0');
  std::vector<BadFile> cases = {
      {"empty file", "", kInvalid, "the file is 0 bytes, too short"},
      {"7 bytes", std::string(7, '\0'), kInvalid,
       "the file is 7 bytes, too short"},
      {"header length 0", Le64(0) + "{}", kInvalid, "header length is 0"},
      {"header longer than the file", Le64(100) + "{}", kInvalid,
       "header length 100 exceeds the 2 bytes"},
      {"header above the limit", Le64(kMaxSafetensorsHeaderBytes + 1) + "{}",
       kInvalid, "exceeds the limit of 100000000"},
      {"header length 2^64-1", Le64(~uint64_t{0}) + "{}", kInvalid,
       "exceeds the limit"},
      {"not JSON", MakeFile("{x"), kInvalid, "header is not valid JSON"},
      {"unterminated", MakeFile(R"({"a":)"), kInvalid,
       "header is not valid JSON"},
      {"trailing garbage", MakeFile("{} x"), kInvalid,
       "header is not valid JSON"},
      {"two objects", MakeFile("{}{}"), kInvalid, "header is not valid JSON"},
      {"NUL padding", MakeFile(std::string("{}\0\0", 4)), kInvalid,
       "header is not valid JSON: NUL byte at byte 2"},
      {"NUL then more JSON", MakeFile(std::string("{}\0{\"w\":1}", 10)),
       kInvalid, "NUL byte at byte 2"},
      {"invalid UTF-8", MakeFile("{\"\xff\":{}}"), kInvalid,
       "header is not valid JSON"},
      {"array", MakeFile("[]"), kInvalid, "header must be a JSON object"},
      {"number", MakeFile("3"), kInvalid, "header must be a JSON object"},
      {"string", MakeFile(R"("x")"), kInvalid, "header must be a JSON object"},
      {"deep nesting", MakeFile(std::string(100000, '[')), kInvalid,
       "header must be a JSON object, not an array"},
      {"metadata not an object", MakeFile(R"({"__metadata__":"x"})"), kInvalid,
       "__metadata__ must be an object of strings, not a string"},
      {"metadata null", MakeFile(R"({"__metadata__":null})"), kInvalid,
       "__metadata__ must be an object of strings, not null"},
      {"metadata value not a string", MakeFile(R"({"__metadata__":{"k":1}})"),
       kInvalid, "__metadata__ value of 'k' must be a string, not a number"},
      {"metadata nested", MakeFile(R"({"__metadata__":{"k":{}}})"), kInvalid,
       "__metadata__ value of 'k' must be a string, not an object"},
      {"metadata duplicate key",
       MakeFile(R"({"__metadata__":{"k":"1","k":"2"}})"), kInvalid,
       "__metadata__ has a duplicate key 'k'"},
      {"duplicate metadata",
       MakeFile(R"({"__metadata__":{},"__metadata__":{}})"), kInvalid,
       "duplicate key '__metadata__'"},
      {"duplicate tensor key",
       MakeFile(absl::StrCat(R"({"w":)", ok_w, R"(,"w":)", ok_w, "}"),
                eight + eight),
       kInvalid, "duplicate key 'w'"},
      {"tensor not an object", MakeFile(R"({"w":[1]})"), kInvalid,
       "tensor 'w': must be an object with dtype, shape and data_offsets, not "
       "an array"},
      {"missing dtype",
       MakeFile(OneTensor(R"({"shape":[2],"data_offsets":[0,8]})"), eight),
       kInvalid, "tensor 'w': missing field 'dtype'"},
      {"missing shape",
       MakeFile(OneTensor(R"({"dtype":"F32","data_offsets":[0,8]})"), eight),
       kInvalid, "tensor 'w': missing field 'shape'"},
      {"missing data_offsets",
       MakeFile(OneTensor(R"({"dtype":"F32","shape":[2]})"), eight), kInvalid,
       "tensor 'w': missing field 'data_offsets'"},
      {"unknown field",
       MakeFile(
           OneTensor(
               R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1})"),
           eight),
       kInvalid, "tensor 'w': unknown field 'x'"},
      {"duplicate field",
       MakeFile(
           OneTensor(
               R"({"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]})"),
           eight),
       kInvalid, "tensor 'w': duplicate field 'dtype'"},
      {"dtype not a string",
       MakeFile(OneTensor(R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})"),
                eight),
       kInvalid, "tensor 'w': dtype must be a string, not a number"},
      {"unknown dtype",
       MakeFile(
           OneTensor(R"({"dtype":"F33","shape":[2],"data_offsets":[0,8]})"),
           eight),
       kInvalid, "tensor 'w': unknown dtype 'F33'"},
      {"torch spelling is not a safetensors dtype",
       MakeFile(
           OneTensor(R"({"dtype":"float32","shape":[2],"data_offsets":[0,8]})"),
           eight),
       kInvalid, "unknown dtype 'float32'"},
      {"unsupported U16",
       MakeFile(
           OneTensor(R"({"dtype":"U16","shape":[4],"data_offsets":[0,8]})"),
           eight),
       kInvalid,
       "tensor 'w': unsupported dtype 'U16' (modelstate supports F32"},
      {"unsupported F8_E4M3",
       MakeFile(
           OneTensor(R"({"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]})"),
           eight),
       kInvalid, "unsupported dtype 'F8_E4M3'"},
      {"unsupported C64",
       MakeFile(
           OneTensor(R"({"dtype":"C64","shape":[1],"data_offsets":[0,8]})"),
           eight),
       kInvalid, "unsupported dtype 'C64'"},
      {"shape not an array",
       MakeFile(OneTensor(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})"),
                eight),
       kInvalid,
       "tensor 'w': shape must be an array of non-negative integers, not a "
       "number"},
      {"negative dimension",
       MakeFile(
           OneTensor(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"),
           eight),
       kInvalid, "tensor 'w': shape has a negative dimension -2"},
      {"fractional dimension",
       MakeFile(
           OneTensor(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"),
           eight),
       kInvalid, "tensor 'w': 2.0 is not a non-negative integer"},
      {"nested shape",
       MakeFile(
           OneTensor(R"({"dtype":"F32","shape":[[2]],"data_offsets":[0,8]})"),
           eight),
       kInvalid,
       "shape must be an array of non-negative integers, not an array"},
      {"dimension above int64",
       MakeFile(
           OneTensor(
               R"({"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]})"),
           eight),
       kInvalid, "shape dimension 9223372036854775808 is too large"},
      {"dimension above uint64",
       MakeFile(
           OneTensor(
               R"({"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]})"),
           eight),
       kInvalid, "is not a non-negative integer"},
      {"element count overflows",
       MakeFile(
           OneTensor(
               R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})"),
           eight),
       kInvalid, "tensor 'w': shape [4294967296, 4294967296] is too large"},
      {"byte count overflows",
       MakeFile(
           OneTensor(
               R"({"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]})"),
           eight),
       kInvalid, "shape [4611686018427387904] is too large"},
      {"offsets not an array",
       MakeFile(OneTensor(R"({"dtype":"F32","shape":[2],"data_offsets":"0"})"),
                eight),
       kInvalid,
       "tensor 'w': data_offsets must be an array of two non-negative "
       "integers, not a string"},
      {"one offset",
       MakeFile(OneTensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})"),
                eight),
       kInvalid, "tensor 'w': data_offsets must have exactly 2 elements"},
      {"three offsets",
       MakeFile(
           OneTensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8,8]})"),
           eight),
       kInvalid, "data_offsets must have exactly 2 elements"},
      {"negative offset",
       MakeFile(
           OneTensor(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})"),
           eight),
       kInvalid, "tensor 'w': data_offsets has a negative offset -8"},
      {"offset null",
       MakeFile(
           OneTensor(R"({"dtype":"F32","shape":[2],"data_offsets":[0,null]})"),
           eight),
       kInvalid, "data_offsets must be an array of two non-negative integers"},
      {"end before begin",
       MakeFile(
           OneTensor(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})"),
           eight),
       kInvalid, "tensor 'w': data_offsets [8, 0] end before they begin"},
      {"span does not match shape",
       MakeFile(
           OneTensor(R"({"dtype":"F32","shape":[3],"data_offsets":[0,10]})"),
           std::string(10, '\0')),
       kInvalid,
       "tensor 'w': data_offsets [0, 10] span 10 bytes but shape [3] of F32 "
       "needs 12"},
      {"truncated data", MakeFile(OneTensor(ok_w), std::string(5, '\0')),
       kInvalid,
       "tensor 'w': data_offsets [0, 8] run past the end of the data section "
       "(5 bytes)"},
      {"no data at all", MakeFile(OneTensor(ok_w)), kInvalid,
       "run past the end of the data section (0 bytes)"},
      {"trailing bytes", MakeFile(OneTensor(ok_w), eight + "x"), kInvalid,
       "the data section has 9 bytes but the tensors cover only 8"},
      {"overlap",
       MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                eight),
       kInvalid,
       "tensor 'b': data_offsets [4, 8] overlap tensor 'a' (which ends at 8)"},
      {"same range twice",
       MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                eight),
       kInvalid, "overlap tensor 'a'"},
      {"gap",
       MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                eight + "abcd"),
       kInvalid,
       "tensor 'b': data_offsets [8, 12] leave a gap of 4 bytes after tensor "
       "'a'"},
      {"gap at the start",
       MakeFile(
           OneTensor(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})"),
           eight),
       kInvalid, "leave a gap of 4 bytes after the start of the data section"},
  };
  return cases;
}

TEST_F(SafetensorsTest, RejectsMalformedFiles) {
  for (const BadFile& c : BadFiles()) {
    SCOPED_TRACE(c.name);
    EXPECT_THAT(ParseSafetensors(c.bytes),
                StatusIs(c.code, HasSubstr(c.message)));
    const std::string path = WriteRaw("bad.safetensors", c.bytes);
    EXPECT_THAT(
        ReadSafetensorsFile(path),
        StatusIs(c.code, AllOf(HasSubstr(path + ": "), HasSubstr(c.message))));
    EXPECT_THAT(
        ReadSafetensorsHeader(path),
        StatusIs(c.code, AllOf(HasSubstr(path + ": "), HasSubstr(c.message))));
  }
}

TEST_F(SafetensorsTest, InvalidJsonMessagesStayShort) {
  // An unterminated string as long as the header: the parser's message
  // quotes the token, which must not end up whole in the status.
  std::string json = "{\"" + std::string(100000, 'a');
  absl::StatusOr<StateDict> result = ParseSafetensors(MakeFile(json));
  EXPECT_THAT(result, StatusIs(kInvalid, HasSubstr("not valid JSON")));
  EXPECT_LT(result.status().message().size(), 400u);
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  const std::string path = Path("absent.safetensors");
  EXPECT_THAT(ReadSafetensorsFile(path),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  EXPECT_THAT(ReadSafetensorsHeader(path),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
}

TEST_F(SafetensorsTest, DirectoryIsRejected) {
  EXPECT_THAT(ReadSafetensorsFile(dir_),
              StatusIs(kInvalid, HasSubstr("not a regular file")));
}

TEST_F(SafetensorsTest, EveryTruncationIsRejected) {
  StateDict sd;
  sd.tensors.Set("w", Pattern(DType::kFloat32, {3}, 1));
  sd.tensors.Set("b", Pattern(DType::kInt64, {2}, 2));
  const std::string path = Path("t.safetensors");
  MODELSTATE_ASSERT_OK(WriteSafetensorsFile(path, sd, {{"k", "v"}}));
  const std::string file = ReadAll(path);
  for (size_t size = 0; size < file.size(); ++size) {
    EXPECT_THAT(ParseSafetensors(file.substr(0, size)), StatusIs(kInvalid))
        << size;
  }
  MODELSTATE_EXPECT_OK(ParseSafetensors(file));
}

// Random byte flips of a valid file: every result is either a clean error or
// a state_dict whose tensors are consistent; nothing crashes (the ASan build
// checks the reads).
TEST_F(SafetensorsTest, SurvivesRandomCorruption) {
  const std::string path = Path("c.safetensors");
  MODELSTATE_ASSERT_OK(
      WriteSafetensorsFile(path, SampleStateDict(), {{"format", "pt"}}));
  const std::string file = ReadAll(path);
  std::mt19937 rng(1234);
  int ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bytes = file;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) {
      // Mostly the header, where the structure is.
      size_t limit =
          (rng() % 4 == 0) ? bytes.size() : std::min<size_t>(bytes.size(), 400);
      bytes[rng() % limit] = static_cast<char>(rng());
    }
    absl::StatusOr<StateDict> sd = ParseSafetensors(bytes);
    if (sd.ok()) {
      ++ok;
      for (const auto& item : sd->tensors) {
        EXPECT_EQ(item.value.nbytes(), static_cast<size_t>(item.value.numel()) *
                                           ElementSize(item.value.dtype()));
      }
    } else {
      EXPECT_FALSE(sd.status().message().empty());
    }
  }
  EXPECT_GT(ok, 0);  // Flips in tensor bytes leave valid files.
}

}  // namespace
}  // namespace modelstate

// Storage that views a file's bytes (MappedFile, Storage::MapFileBytes):
// read-only, checked against its CRC-32C the first time its bytes are read
// and whenever a scrub asks, and never served once found damaged.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "base/crc32c.h"
#include "base/mapped_file.h"
#include "core/module.h"
#include "core/state_digest.h"
#include "core/state_stream.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

namespace fs = std::filesystem;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class MappedStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mapped-storage-test-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    path_ = (dir_ / "bytes.bin").string();
    // 16 bytes of a header, then 8 floats.
    std::string contents(16, 'h');
    for (int i = 0; i < 8; ++i) {
      float f = 0.5f * static_cast<float>(i);
      contents.append(reinterpret_cast<const char*>(&f), sizeof f);
    }
    floats_ = contents.substr(16);
    std::ofstream(path_, std::ios::binary) << contents;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A storage over the 8 floats, expecting `crc` (their own by default).
  std::shared_ptr<Storage> Map(std::optional<uint32_t> crc = std::nullopt) {
    absl::StatusOr<std::shared_ptr<const MappedFile>> file =
        MappedFile::Open(path_);
    EXPECT_THAT(file, IsOk());
    return Storage::MapFileBytes(*file, 16, 32, crc.value_or(Crc32c(floats_)),
                                 "module 'a/b', bytes.bin entry 's0'");
  }

  // Overwrites byte `offset` of the file through a second descriptor, as
  // damage on disk would; a shared mapping sees it.
  void Damage(off_t offset) {
    int fd = open(path_.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    char c = 0x7f;
    ASSERT_EQ(pwrite(fd, &c, 1, offset), 1);
    close(fd);
  }

  fs::path dir_;
  std::string path_;
  std::string floats_;
};

TEST_F(MappedStorageTest, AMappedFileShowsTheFileAndOutlivesItsName) {
  absl::StatusOr<std::shared_ptr<const MappedFile>> file =
      MappedFile::Open(path_);
  ASSERT_THAT(file, IsOk());
  fs::remove(path_);
  EXPECT_EQ((*file)->bytes().substr(16), floats_);
  EXPECT_EQ((*file)->path(), path_);
  EXPECT_THAT(MappedFile::Open(path_),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path_)));
  std::ofstream((dir_ / "empty").string());
  absl::StatusOr<std::shared_ptr<const MappedFile>> empty =
      MappedFile::Open((dir_ / "empty").string());
  ASSERT_THAT(empty, IsOk());
  EXPECT_TRUE((*empty)->bytes().empty());
}

TEST_F(MappedStorageTest, IntactBytesAreServedAndNeverWrittenInPlace) {
  std::shared_ptr<Storage> storage = Map();
  EXPECT_TRUE(storage->read_only());
  EXPECT_THAT(storage->CheckIntegrity(), IsOk());
  EXPECT_FALSE(storage->damaged());
  absl::StatusOr<Tensor> t = Tensor::FromStorage(DType::kFloat32, {8}, storage);
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->data<float>()[3], 1.5f);
  EXPECT_THAT(CheckTensorBytes("w", *t), IsOk());
  // Neither an in-place conversion nor an overwrite touches the file.
  EXPECT_FALSE(t->CanConvertInPlace(DType::kFloat16));
  absl::StatusOr<Tensor> source = Tensor::Zeros(DType::kFloat32, {8});
  ASSERT_THAT(source, IsOk());
  ASSERT_THAT(t->CopyFrom(*source), IsOk());
  EXPECT_NE(t->storage(), storage);
  EXPECT_FALSE(t->storage()->read_only());
  EXPECT_EQ(t->data<float>()[3], 0.0f);
  std::ifstream in(path_, std::ios::binary);
  std::string after((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(after.substr(16), floats_);
}

TEST_F(MappedStorageTest, DamagedBytesAreNamedAndStayDamaged) {
  const uint64_t damaged_before = Storage::DamagedCount();
  std::shared_ptr<Storage> storage = Map(Crc32c(floats_) ^ 1);
  absl::Status status = storage->CheckIntegrity();
  EXPECT_THAT(status,
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("module 'a/b', bytes.bin entry 's0'"),
                             HasSubstr("CRC-32C"), HasSubstr("not served"))));
  EXPECT_TRUE(storage->damaged());
  EXPECT_EQ(Storage::DamagedCount(), damaged_before + 1);
  // Asked again (a scrub), it stays damaged and is counted once.
  EXPECT_THAT(storage->CheckIntegrity(/*again=*/true),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(Storage::DamagedCount(), damaged_before + 1);
  absl::StatusOr<Tensor> t = Tensor::FromStorage(DType::kFloat32, {8}, storage);
  ASSERT_THAT(t, IsOk());
  EXPECT_THAT(CheckTensorBytes("fc.weight", *t),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("'fc.weight': module 'a/b'"))));
}

TEST_F(MappedStorageTest, AScrubFindsDamageAfterTheFirstCheck) {
  std::shared_ptr<Storage> storage = Map();
  ASSERT_THAT(storage->CheckIntegrity(), IsOk());
  Damage(20);
  // Once found intact, a plain check does not read again...
  EXPECT_THAT(storage->CheckIntegrity(), IsOk());
  // ...a scrub does, and from then on every read is refused.
  EXPECT_THAT(storage->CheckIntegrity(/*again=*/true),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(storage->CheckIntegrity(), StatusIs(absl::StatusCode::kDataLoss));
}

TEST_F(MappedStorageTest, OtherStoragesAlwaysPass) {
  absl::StatusOr<std::shared_ptr<Storage>> plain =
      Storage::Allocate(64, Device::Cpu());
  ASSERT_THAT(plain, IsOk());
  EXPECT_FALSE((*plain)->read_only());
  EXPECT_THAT((*plain)->CheckIntegrity(/*again=*/true), IsOk());
  EXPECT_THAT(CheckTensorBytes("x", Tensor()), IsOk());
}

// A state_dict with an intact entry "a", a damaged entry "b" and an intact
// entry "c" after it.
StateDict ThreeEntries(const std::shared_ptr<Storage>& intact,
                       const std::shared_ptr<Storage>& damaged) {
  StateDict sd;
  sd.tensors.Set("a", *Tensor::FromStorage(DType::kFloat32, {8}, intact));
  sd.tensors.Set("b", *Tensor::FromStorage(DType::kFloat32, {8}, damaged));
  sd.tensors.Set("c", *Tensor::Zeros(DType::kFloat32, {2}));
  return sd;
}

TEST_F(MappedStorageTest, AStreamServesNoByteOfADamagedEntry) {
  StateDict sd = ThreeEntries(Map(), Map(Crc32c(floats_) ^ 1));
  absl::StatusOr<std::unique_ptr<StateDictReader>> reader =
      StateDictReader::Create(sd, std::nullopt);
  ASSERT_THAT(reader, IsOk());
  std::string out;
  // "a" is served whole; the read that meets "b" fails before any of it.
  absl::StatusOr<size_t> first = (*reader)->Read(32, &out);
  ASSERT_THAT(first, IsOk());
  EXPECT_EQ(out, floats_);
  EXPECT_THAT((*reader)->Read(1 << 20, &out),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("'b'"), HasSubstr("module 'a/b'"),
                             HasSubstr("bytes.bin"))));
  EXPECT_EQ(out.size(), 32u);
}

TEST_F(MappedStorageTest, DigestsRefuseDamagedEntries) {
  StateDict sd = ThreeEntries(Map(), Map(Crc32c(floats_) ^ 1));
  EXPECT_THAT(StateDictSubjects(sd, 1),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'b'")));
  StateDict good = ThreeEntries(Map(), Map());
  EXPECT_THAT(StateDictSubjects(good, 1), IsOk());
}

TEST_F(MappedStorageTest, AModuleCheckNamesTheDamagedTensorByKey) {
  std::shared_ptr<Module> root = Module::Create("Net");
  std::shared_ptr<Module> fc = Module::Create("Linear");
  ASSERT_THAT(root->RegisterModule("fc", fc), IsOk());
  ASSERT_THAT(
      fc->RegisterParameter("weight", *MakeParameter(*Tensor::FromStorage(
                                          DType::kFloat32, {8}, Map()))),
      IsOk());
  EXPECT_THAT(CheckHeldBytes(*root), IsOk());
  ASSERT_THAT(root->RegisterBuffer(
                  "stats", *Tensor::FromStorage(DType::kFloat32, {8},
                                                Map(Crc32c(floats_) ^ 1))),
              IsOk());
  EXPECT_THAT(CheckHeldBytes(*root),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'stats'")));
}

}  // namespace
}  // namespace modelstate

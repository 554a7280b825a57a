// MappedFile::ReadCatchingBusErrors against a file cut short under its
// mapping: the read that meets the missing pages is told, the process lives
// on (on any thread, any number of times), and a fault outside a guarded
// read still ends the process as it would have.
#include "base/mapped_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "gtest/gtest.h"

namespace modelstate {
namespace {

namespace fs = std::filesystem;

class MappedFileTest : public ::testing::Test {
 protected:
  MappedFileTest()
      : path_(fs::temp_directory_path() /
              absl::StrCat("mapped-file-test-", getpid(), "-",
                           ::testing::UnitTest::GetInstance()
                               ->current_test_info()
                               ->name())),
        page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
    std::ofstream(path_) << std::string(4 * page_, 'x');
  }
  ~MappedFileTest() override {
    std::error_code ignored;
    fs::remove(path_, ignored);
  }

  std::shared_ptr<const MappedFile> Map() {
    absl::StatusOr<std::shared_ptr<const MappedFile>> file =
        MappedFile::Open(path_.string());
    EXPECT_TRUE(file.ok()) << file.status();
    return file.ok() ? *file : nullptr;
  }

  const fs::path path_;
  const size_t page_;
};

TEST_F(MappedFileTest, AnIntactMappingIsReadWhole) {
  std::shared_ptr<const MappedFile> file = Map();
  ASSERT_NE(file, nullptr);
  uint32_t crc = 0;
  EXPECT_TRUE(MappedFile::ReadCatchingBusErrors(
      file->bytes(), [&] { crc = Crc32c(file->bytes()); }));
  EXPECT_EQ(crc, Crc32c(std::string(4 * page_, 'x')));
}

TEST_F(MappedFileTest, AReadPastAFileCutShortIsFalseAndTheProcessLivesOn) {
  std::shared_ptr<const MappedFile> file = Map();
  ASSERT_NE(file, nullptr);
  fs::resize_file(path_, page_);
  uint32_t crc = 0;
  // Twice: the first fault's handler must not leave SIGBUS blocked.
  for (int i = 0; i < 2; ++i) {
    EXPECT_FALSE(MappedFile::ReadCatchingBusErrors(file->bytes(), [&] {
      crc = Crc32c(file->bytes());
    })) << i;
  }
  // What is still in the file reads as before.
  const absl::string_view first = file->bytes().substr(0, page_);
  EXPECT_TRUE(
      MappedFile::ReadCatchingBusErrors(first, [&] { crc = Crc32c(first); }));
  EXPECT_EQ(crc, Crc32c(std::string(page_, 'x')));
}

TEST_F(MappedFileTest, ThreadsCatchTheirOwnFaults) {
  std::shared_ptr<const MappedFile> file = Map();
  ASSERT_NE(file, nullptr);
  fs::resize_file(path_, page_);
  std::vector<std::thread> threads;
  std::vector<int> caught(4, 0);
  for (size_t t = 0; t < caught.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        uint32_t crc = 0;
        if (!MappedFile::ReadCatchingBusErrors(
                file->bytes(), [&] { crc = Crc32c(file->bytes()); })) {
          ++caught[t];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(caught, std::vector<int>(4, 50));
}

// A fault in bytes the guarded read was not given is not its to catch.
TEST_F(MappedFileTest, AFaultOutsideTheGuardedBytesStillEndsTheProcess) {
  std::shared_ptr<const MappedFile> file = Map();
  ASSERT_NE(file, nullptr);
  fs::resize_file(path_, page_);
  const absl::string_view first = file->bytes().substr(0, page_);
  const absl::string_view last = file->bytes().substr(3 * page_);
  EXPECT_DEATH(
      {
        uint32_t crc = 0;
        MappedFile::ReadCatchingBusErrors(first, [&] { crc = Crc32c(last); });
        std::fprintf(stderr, "survived %u\n", crc);
      },
      "");
}

}  // namespace
}  // namespace modelstate

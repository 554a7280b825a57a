// ReadGuardedFile against the layouts it meets: plain files and a
// Kubernetes Secret volume, whose files are symlinks into "..data", itself
// a symlink to a timestamped directory that an update replaces.
#include "base/file_util.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::IsOkAndHolds;
using ::modelstate::testing::StatusIs;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

class GuardedFileTest : public ::testing::Test {
 protected:
  GuardedFileTest()
      : dir_(fs::temp_directory_path() /
             absl::StrCat("guarded-file-test-", getpid(), "-",
                          ::testing::UnitTest::GetInstance()
                              ->current_test_info()
                              ->name())) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~GuardedFileTest() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  static void Write(const fs::path& path, const std::string& text, int mode) {
    std::ofstream(path) << text;
    fs::permissions(path, static_cast<fs::perms>(mode));
  }

  // A Secret's volume as the kubelet writes it: the files of `version` in
  // "..<version>", "..data" pointing at it, and tokens.json pointing into
  // "..data". An update writes a new directory and swaps "..data" by a
  // rename, so that readers see all of one version or all of the other.
  void SecretVersion(const std::string& version, const std::string& text,
                     int mode) {
    const fs::path versioned = dir_ / absl::StrCat("..", version);
    fs::create_directories(versioned);
    Write(versioned / "tokens.json", text, mode);
    const fs::path next = dir_ / "..data_tmp";
    fs::create_directory_symlink(versioned.filename(), next);
    fs::rename(next, dir_ / "..data");
    if (!fs::is_symlink(fs::symlink_status(dir_ / "tokens.json"))) {
      fs::create_symlink("..data/tokens.json", dir_ / "tokens.json");
    }
  }

  const fs::path dir_;
};

TEST_F(GuardedFileTest, RefusesAFileItsGroupOrOthersMayWrite) {
  const std::string path = (dir_ / "tokens.json").string();
  for (int mode : {0600, 0640, 0644, 0444, 0400}) {
    SCOPED_TRACE(mode);
    Write(path, "{}", mode);
    uint32_t bits = 0;
    EXPECT_THAT(ReadGuardedFile(path, &bits), IsOkAndHolds("{}"));
    EXPECT_EQ(bits, static_cast<uint32_t>(mode));
  }
  Write(path, "{}", 0620);
  EXPECT_THAT(ReadGuardedFile(path),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr(path + " is writable by its group (mode "
                                        "0620)")));
}

// The mode checked is the file's the symlinks lead to, never a link's own
// (always 0777): a Secret mounted 0644 or 0600 is accepted, and one whose
// file others may write is refused.
TEST_F(GuardedFileTest, FollowsAKubernetesSecretsSymlinksToTheFile) {
  const std::string path = (dir_ / "tokens.json").string();
  SecretVersion("2026_11_30_00_00_00.1", "first", 0644);
  uint32_t bits = 0;
  EXPECT_THAT(ReadGuardedFile(path, &bits), IsOkAndHolds("first"));
  EXPECT_EQ(bits, 0644u);
  // An update (the kubelet's "..data" swap), to defaultMode 0600.
  SecretVersion("2026_11_30_00_05_00.2", "second", 0600);
  EXPECT_THAT(ReadGuardedFile(path, &bits), IsOkAndHolds("second"));
  EXPECT_EQ(bits, 0600u);
  // A version whose file others may write is refused through the links.
  SecretVersion("2026_11_30_00_10_00.3", "third", 0666);
  EXPECT_THAT(ReadGuardedFile(path),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("is writable by its group and others "
                                 "(mode 0666)")));
  // A link to nowhere is a missing file.
  fs::remove_all(dir_ / "..2026_11_30_00_10_00.3");
  EXPECT_THAT(ReadGuardedFile(path), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace modelstate

// The audit log's SQLite index, and the start-up it buys: a log closed
// cleanly reopens by reading one record; anything else (a crash, a file
// touched while the server was down, a missing or damaged index, an old
// data directory without one) makes Open read, check and re-index it all.
#include "service/audit_index.h"

#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/merkle.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/audit_log.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

namespace fs = std::filesystem;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::IsOkAndHolds;
using ::modelstate::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

class AuditIndexTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info =
        ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("audit_index_test_", getpid(), "_", info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  std::string Path(const std::string& name) const {
    return (dir_ / name).string();
  }
  AuditLogOptions Options() const {
    AuditLogOptions o;
    o.hashes_path = Path("audit.hashes");
    o.checkpoint_path = Path("audit.checkpoint");
    o.index_path = Path("audit.index");
    return o;
  }
  absl::StatusOr<std::unique_ptr<AuditLog>> OpenLog() {
    return AuditLog::Open(Path("audit.log"), Options());
  }
  // Appends `n` records: module "m<i % 3>", identity "alice" or "bob".
  void Append(AuditLog& log, int n) {
    for (int i = 0; i < n; ++i) {
      AuditRecord r;
      r.type = i % 2 == 0 ? "registration" : "answer";
      r.ns = "team";
      r.module = absl::StrCat("m", i % 3);
      r.identity = i % 4 == 0 ? "bob" : "alice";
      r.outcome = "keep";
      r.details_json = absl::StrCat("{\"i\":", i, "}");
      ASSERT_THAT(log.Append(std::move(r)), IsOk());
    }
    ASSERT_THAT(log.Sync(log.last_seq()), IsOk());
  }
  std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in),
                       std::istreambuf_iterator<char>());
  }

  fs::path dir_;
};

AuditRecord Row(std::string identity, std::string type, std::string module,
                absl::Time time) {
  AuditRecord r;
  r.identity = std::move(identity);
  r.type = std::move(type);
  r.ns = "team";
  r.module = std::move(module);
  r.outcome = "ok";
  r.correlation_id = "req-" + r.identity;
  r.time = time;
  return r;
}

std::vector<uint64_t> SeqsOf(const std::vector<AuditLocation>& found) {
  std::vector<uint64_t> out;
  for (const AuditLocation& l : found) out.push_back(l.seq);
  return out;
}

// Appenders add rows under the log's lock and commit full batches outside
// it, while readers query: every row lands, in seq order.
TEST_F(AuditIndexTest, FullBatchesAreCommittedWhileReadersQuery) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditIndex> index,
                                  AuditIndex::Open(Path("i.db")));
  constexpr uint64_t kRows = 10'000;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    uint64_t last = 0;
    while (!done) {
      absl::StatusOr<uint64_t> seq = index->LastSeq();
      ASSERT_THAT(seq, IsOk());
      EXPECT_GE(*seq, last);
      last = *seq;
    }
  });
  int full_batches = 0;
  for (uint64_t seq = 1; seq <= kRows; ++seq) {
    AuditRecord r = Row("alice", "build", "a", absl::FromUnixSeconds(seq));
    if (index->Add(r, {seq, seq * 10, 9})) {
      ++full_batches;
      ASSERT_THAT(index->Flush(), IsOk());
    }
  }
  done = true;
  reader.join();
  EXPECT_GE(full_batches, 1);
  EXPECT_THAT(index->LastSeq(), IsOkAndHolds(kRows));
  AuditQuery q;
  q.after_seq = kRows - 3;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<AuditLocation> tail,
                                  index->Find(q));
  EXPECT_THAT(SeqsOf(tail), ElementsAre(kRows - 2, kRows - 1, kRows));
}

// While another connection holds SQLite's write lock, a commit waits for
// it (5 s) and fails: the rows it took stay for the next one, in front of
// those added meanwhile, and adding never waited for the stuck commit.
TEST_F(AuditIndexTest, AFailedCommitKeepsItsRowsAndNeverBlocksAdds) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditIndex> index,
                                  AuditIndex::Open(Path("i.db")));
  auto add = [&](uint64_t seq) {
    (void)index->Add(Row("alice", "build", "a", absl::FromUnixSeconds(seq)),
                     {seq, seq * 10, 9});
  };
  for (uint64_t seq = 1; seq <= 3; ++seq) add(seq);
  ASSERT_THAT(index->Flush(), IsOk());
  for (uint64_t seq = 4; seq <= 6; ++seq) add(seq);

  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(Path("i.db").c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr),
            SQLITE_OK);
  std::atomic<bool> flushing{false};
  absl::Status stuck;
  std::thread commit([&] {
    flushing = true;
    stuck = index->Flush();
  });
  while (!flushing) std::this_thread::yield();
  absl::SleepFor(absl::Milliseconds(200));  // into SQLite's busy wait
  const absl::Time before_adds = absl::Now();
  for (uint64_t seq = 7; seq <= 9; ++seq) add(seq);
  const absl::Duration adding = absl::Now() - before_adds;
  commit.join();
  EXPECT_THAT(stuck, Not(IsOk()));
  // Far below the 5 s the commit held its lock.
  EXPECT_LT(adding, absl::Seconds(2));
  ASSERT_EQ(sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(other);

  EXPECT_THAT(index->LastSeq(), IsOkAndHolds(9u));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<AuditLocation> all,
                                  index->Find(AuditQuery()));
  EXPECT_THAT(SeqsOf(all), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9));
}

TEST_F(AuditIndexTest, FindsByEveryFieldInSeqOrderAndPages) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditIndex> index,
                                  AuditIndex::Open(Path("i.db")));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const std::vector<AuditRecord> rows = {
      Row("alice", "build", "a", t0),
      Row("bob", "delete", "b", t0 + absl::Seconds(1)),
      Row("alice", "delete", "a", t0 + absl::Seconds(2)),
      Row("carol", "build", "b", t0 + absl::Seconds(3)),
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_FALSE(index->Add(rows[i], {i + 1, i * 100, 99}));  // no batch
  }
  auto find = [&](AuditQuery q) {
    absl::StatusOr<std::vector<AuditLocation>> found = index->Find(q);
    EXPECT_THAT(found, IsOk());
    return found.ok() ? SeqsOf(*found) : std::vector<uint64_t>{};
  };
  AuditQuery q;
  EXPECT_THAT(find(q), ElementsAre(1, 2, 3, 4));
  q.identity = "alice";
  EXPECT_THAT(find(q), ElementsAre(1, 3));
  q = {};
  q.correlation_id = "req-bob";
  EXPECT_THAT(find(q), ElementsAre(2));
  q = {};
  q.type = "delete";
  q.module = "a";
  EXPECT_THAT(find(q), ElementsAre(3));
  q = {};
  q.since = t0 + absl::Seconds(1);
  q.until = t0 + absl::Seconds(3);
  EXPECT_THAT(find(q), ElementsAre(2, 3));
  q = {};
  q.after_seq = 1;
  q.limit = 2;
  EXPECT_THAT(find(q), ElementsAre(2, 3));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::optional<AuditLocation> third,
                                  index->Locate(3));
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(third->offset, 200u);
  EXPECT_EQ(third->length, 99u);
  EXPECT_THAT(index->Locate(5), IsOk());
  EXPECT_FALSE(index->Locate(5)->has_value());
  EXPECT_EQ(*index->LastSeq(), 4u);
}

TEST_F(AuditIndexTest, TheCleanStampIsTakenAwayWhenRead) {
  const AuditFileStamp stamp{123, 456789, 42, 7};
  {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditIndex> index,
                                    AuditIndex::Open(Path("i.db")));
    MODELSTATE_ASSERT_OK_AND_ASSIGN(std::optional<AuditFileStamp> none,
                                    index->TakeCleanStamp());
    EXPECT_FALSE(none.has_value());
    MODELSTATE_ASSERT_OK(index->SaveCleanStamp(stamp));
  }
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditIndex> index,
                                  AuditIndex::Open(Path("i.db")));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::optional<AuditFileStamp> taken,
                                  index->TakeCleanStamp());
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(*taken, stamp);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(taken, index->TakeCleanStamp());
  EXPECT_FALSE(taken.has_value());
}

TEST_F(AuditIndexTest, AnUnreadableIndexIsMadeAnew) {
  {
    std::ofstream junk(Path("i.db"), std::ios::binary);
    junk << std::string(8192, 'x');
  }
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditIndex> index,
                                  AuditIndex::Open(Path("i.db")));
  EXPECT_THAT(index->rebuilt(), HasSubstr("unusable"));
  EXPECT_EQ(*index->LastSeq(), 0u);
}

// ------------------------------------------------------------- start-up

TEST_F(AuditIndexTest, ACleanlyClosedLogReopensFromTheIndex) {
  std::string before;
  {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
    // A first start with an index reads the (empty) log once.
    EXPECT_THAT(log->read_whole_log(), HasSubstr("no clean-close stamp"));
    Append(*log, 250);
  }
  before = ReadAll(Path("audit.log"));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
  EXPECT_THAT(log->read_whole_log(), IsEmpty());
  EXPECT_EQ(log->last_seq(), 250u);
  // Queries, Get and the chain carry on from what the index says.
  AuditQuery q;
  q.module = "m1";
  q.identity = "bob";
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<AuditRecord> found,
                                  log->Query(q));
  ASSERT_FALSE(found.empty());
  for (const AuditRecord& r : found) {
    EXPECT_EQ(r.module, "m1");
    EXPECT_EQ(r.identity, "bob");
  }
  MODELSTATE_ASSERT_OK_AND_ASSIGN(AuditRecord last, log->Get(250));
  EXPECT_EQ(last.details_json, "{\"i\":249}");
  Append(*log, 1);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(AuditRecord next, log->Get(251));
  EXPECT_EQ(next.prev, last.hash);
  EXPECT_THAT(log->Get(252), StatusIs(absl::StatusCode::kNotFound));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(AuditVerification v,
                                  AuditLog::Verify(Path("audit.log")));
  EXPECT_TRUE(v.ok) << v.problem;
  EXPECT_EQ(v.records, 251u);
  EXPECT_EQ(ReadAll(Path("audit.log")).substr(0, before.size()), before);
}

TEST_F(AuditIndexTest, AfterACrashTheWholeLogIsReadAgain) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
  Append(*log, 20);
  // What a crash leaves: the files of a log that is still open (its index
  // has no clean-close stamp, and the last rows may not be in it).
  const fs::path copy = dir_ / "copy";
  fs::create_directories(copy);
  for (const char* name : {"audit.log", "audit.hashes", "audit.index",
                           "audit.index-wal", "audit.index-shm"}) {
    if (fs::exists(dir_ / name)) fs::copy_file(dir_ / name, copy / name);
  }
  AuditLogOptions o;
  o.hashes_path = (copy / "audit.hashes").string();
  o.index_path = (copy / "audit.index").string();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<AuditLog> reopened,
      AuditLog::Open((copy / "audit.log").string(), o));
  EXPECT_THAT(reopened->read_whole_log(), HasSubstr("no clean-close stamp"));
  EXPECT_EQ(reopened->last_seq(), 20u);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<AuditRecord> all,
                                  reopened->Query(AuditQuery{}));
  EXPECT_EQ(all.size(), 20u);
}

// A crash leaves the index a batch behind the log (its rows are committed
// 4096 at a time) and the tree at most a leaf behind: the next start reads
// only the records after the last one both hold.
class AuditCrashTest : public AuditIndexTest {
 protected:
  static constexpr int kRecords = 5000;

  // Copies the files of a log that is still open to `name`, as a SIGKILL
  // would leave them; `edit` may change the copied log first.
  AuditLogOptions CrashCopy(const std::string& name,
                            absl::FunctionRef<void(std::string&)> edit) {
    const fs::path copy = dir_ / name;
    fs::create_directories(copy);
    for (const char* file : {"audit.log", "audit.hashes", "audit.index",
                             "audit.index-wal", "audit.index-shm"}) {
      if (fs::exists(dir_ / file)) fs::copy_file(dir_ / file, copy / file);
    }
    std::string log = ReadAll((copy / "audit.log").string());
    edit(log);
    std::ofstream((copy / "audit.log").string(),
                  std::ios::binary | std::ios::trunc)
        << log;
    AuditLogOptions o;
    o.hashes_path = (copy / "audit.hashes").string();
    o.index_path = (copy / "audit.index").string();
    return o;
  }
  std::string CopyLog(const std::string& name) const {
    return (dir_ / name / "audit.log").string();
  }
};

TEST_F(AuditCrashTest, OnlyTheRecordsTheIndexLacksAreRead) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
  Append(*log, kRecords);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(MerkleHash root, log->TreeRoot(kRecords));
  AuditLogOptions o = CrashCopy("crash", [](std::string&) {});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> reopened,
                                  AuditLog::Open(CopyLog("crash"), o));
  EXPECT_THAT(reopened->read_whole_log(), IsEmpty());
  EXPECT_THAT(reopened->read_after_crash(),
              HasSubstr("the 904 records after record 4096"));
  EXPECT_FALSE(reopened->recovered_torn_tail());
  EXPECT_EQ(reopened->last_seq(), static_cast<uint64_t>(kRecords));
  EXPECT_THAT(reopened->TreeRoot(kRecords), IsOkAndHolds(root));
  // The records read after the crash are indexed again.
  AuditQuery q;
  q.after_seq = kRecords - 10;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<AuditRecord> tail,
                                  reopened->Query(q));
  ASSERT_EQ(tail.size(), 10u);
  EXPECT_EQ(tail.back().seq, static_cast<uint64_t>(kRecords));
  // The chain goes on from the last record.
  Append(*reopened, 1);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(AuditRecord last, reopened->Get(kRecords));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(AuditRecord next,
                                  reopened->Get(kRecords + 1));
  EXPECT_EQ(next.prev, last.hash);
  reopened.reset();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(AuditVerification v,
                                  AuditLog::Verify(CopyLog("crash")));
  EXPECT_TRUE(v.ok) << v.problem;
  EXPECT_EQ(v.records, static_cast<uint64_t>(kRecords + 1));
}

TEST_F(AuditCrashTest, ATornLastRecordIsCutOffAndTheTreeCatchesUp) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
  Append(*log, kRecords);
  // A crash between a line and its leaf: the tree is one record short of a
  // log that ends in half a line.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(MerkleHash root, log->TreeRoot(kRecords));
  AuditLogOptions o = CrashCopy(
      "torn", [](std::string& text) { text += "{\"seq\":5001,\"ti"; });
  {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<FileHashStore> hashes,
                                    FileHashStore::Open(o.hashes_path));
    ASSERT_THAT(hashes->Truncate(kRecords - 1), IsOk());
  }
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> reopened,
                                  AuditLog::Open(CopyLog("torn"), o));
  EXPECT_THAT(reopened->read_whole_log(), IsEmpty());
  EXPECT_TRUE(reopened->recovered_torn_tail());
  EXPECT_EQ(reopened->last_seq(), static_cast<uint64_t>(kRecords));
  EXPECT_THAT(reopened->TreeRoot(kRecords), IsOkAndHolds(root));
}

TEST_F(AuditCrashTest, AnEditAfterTheIndexedRecordsIsCaught) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
  Append(*log, kRecords);
  // Record 4500 is read after the crash: its changed byte breaks the chain.
  AuditLogOptions o = CrashCopy("edited", [](std::string& text) {
    const size_t at = text.find("{\"i\":4499}");
    ASSERT_NE(at, std::string::npos);
    text[at + 5] = '8';
  });
  EXPECT_THAT(AuditLog::Open(CopyLog("edited"), o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("broken at line 4500")));
}

TEST_F(AuditCrashTest, ATreeThatDisagreesWithTheTailIsRebuilt) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
  Append(*log, kRecords);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(MerkleHash root, log->TreeRoot(kRecords));
  AuditLogOptions o = CrashCopy("leaf", [](std::string&) {});
  {
    // Record 4500's leaf hash, after the last indexed record, goes bad.
    std::fstream hashes(o.hashes_path,
                        std::ios::binary | std::ios::in | std::ios::out);
    hashes.seekp(static_cast<std::streamoff>(StoredHashIndex(0, 4499) * 32));
    hashes.write(std::string(32, 'x').data(), 32);
  }
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> reopened,
                                  AuditLog::Open(CopyLog("leaf"), o));
  EXPECT_THAT(reopened->read_whole_log(),
              HasSubstr("the tree disagrees with record 4500"));
  EXPECT_EQ(reopened->last_seq(), static_cast<uint64_t>(kRecords));
  EXPECT_THAT(reopened->TreeRoot(kRecords), IsOkAndHolds(root));
}

TEST_F(AuditCrashTest, ALogShorterThanItsIndexIsReadWhole) {
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
  Append(*log, kRecords);
  // The last 1,000 lines are gone (a file restored from an older copy):
  // the index and the tree hold records the log does not have, so the
  // whole log is read, the tree cut back, and the index rebuilt.
  AuditLogOptions o = CrashCopy("short", [](std::string& text) {
    size_t cut = text.size();
    for (int i = 0; i < 1001; ++i) cut = text.rfind('\n', cut - 1);
    text.resize(cut + 1);
  });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> reopened,
                                  AuditLog::Open(CopyLog("short"), o));
  EXPECT_THAT(reopened->read_whole_log(),
              HasSubstr("does not match the index and the tree"));
  EXPECT_EQ(reopened->last_seq(), static_cast<uint64_t>(kRecords - 1000));
  EXPECT_THAT(reopened->tree_repair(), HasSubstr("dropped the hashes of 1000"));
}

TEST_F(AuditIndexTest, AnEditWhileTheServerWasDownIsCaughtAtStart) {
  {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
    Append(*log, 30);
  }
  // One byte of record 10, the length unchanged: only a full read sees it,
  // and the changed file no longer matches the clean-close stamp.
  std::string content = ReadAll(Path("audit.log"));
  const size_t at = content.find("{\"i\":9}");
  ASSERT_NE(at, std::string::npos);
  content[at + 5] = '8';
  {
    std::ofstream out(Path("audit.log"), std::ios::binary | std::ios::trunc);
    out << content;
  }
  EXPECT_THAT(OpenLog(), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("broken at line 10")));
}

TEST_F(AuditIndexTest, AnOldDataDirectoryIsIndexedOnItsFirstStart) {
  // A log (and tree) from before the index: its records become the index's
  // rows, and the file is not changed by a byte.
  {
    AuditLogOptions old = Options();
    old.index_path.clear();
    MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log,
                                    AuditLog::Open(Path("audit.log"), old));
    Append(*log, 40);
  }
  const std::string before = ReadAll(Path("audit.log"));
  {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
    EXPECT_THAT(log->read_whole_log(), Not(IsEmpty()));
    EXPECT_EQ(log->last_seq(), 40u);
  }
  EXPECT_EQ(ReadAll(Path("audit.log")), before);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
  EXPECT_THAT(log->read_whole_log(), IsEmpty());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<AuditRecord> all,
                                  log->Query(AuditQuery{}));
  ASSERT_EQ(all.size(), 40u);
  EXPECT_EQ(all.back().seq, 40u);
}

TEST_F(AuditIndexTest, AMissingOrDamagedIndexIsRebuiltFromTheLog) {
  {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
    Append(*log, 12);
  }
  for (const char* suffix : {"", "-wal", "-shm"}) {
    fs::remove(Path(absl::StrCat("audit.index", suffix)));
  }
  {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
    EXPECT_THAT(log->read_whole_log(), Not(IsEmpty()));
    EXPECT_EQ(log->Query(AuditQuery{})->size(), 12u);
  }
  {
    std::ofstream junk(Path("audit.index"), std::ios::binary | std::ios::trunc);
    junk << std::string(4096, 'z');
  }
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
  EXPECT_THAT(log->read_whole_log(), HasSubstr("unusable"));
  EXPECT_EQ(log->Query(AuditQuery{})->size(), 12u);
}

TEST_F(AuditIndexTest, ALogRefusedAtStartGetsNoCleanStamp) {
  {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log, OpenLog());
    Append(*log, 5);
  }
  const std::string good = ReadAll(Path("audit.log"));
  std::string bad = good;
  bad[bad.find("{\"i\":2}") + 5] = '7';
  {
    std::ofstream out(Path("audit.log"), std::ios::binary | std::ios::trunc);
    out << bad;
  }
  EXPECT_THAT(OpenLog(), StatusIs(absl::StatusCode::kInvalidArgument));
  // The refusal must not leave a stamp that would vouch for the bad file.
  EXPECT_THAT(OpenLog(), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace modelstate

// The audit log's Merkle tree (service/audit_tree.h, AuditLog's tree
// methods), the start-up refusal of a log its last checkpoint does not
// cover, and the checkpoint signer with witness cosignatures.
#include "service/audit_tree.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/checkpoint.h"
#include "base/file_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/audit_log.h"
#include "service/checkpoint_signer.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::IsOk;
using ::modelstate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class AuditTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat(
               "audit_tree_test_", getpid(), "_",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const char* name) const { return (dir_ / name).string(); }
  AuditLogOptions Options() const {
    return {Path("audit.hashes"), Path("audit.checkpoint"),
            Path("audit.index")};
  }
  absl::StatusOr<std::unique_ptr<AuditLog>> OpenLog() const {
    return AuditLog::Open(Path("audit.log"), Options());
  }
  static void AppendRecords(AuditLog& log, int n) {
    for (int i = 0; i < n; ++i) {
      AuditRecord r;
      r.type = "delete";
      r.ns = i % 2 == 0 ? "team" : "other";
      r.module = absl::StrCat("m", i);
      ASSERT_THAT(log.Append(std::move(r)).status(), IsOk());
    }
  }
  // The stored lines of the log file.
  std::vector<std::string> Lines() const {
    absl::StatusOr<std::string> content = ReadFile(Path("audit.log"));
    EXPECT_THAT(content.status(), IsOk());
    return absl::StrSplit(*content, '\n', absl::SkipEmpty());
  }
  void WriteLines(const std::vector<std::string>& lines) const {
    std::ofstream out(Path("audit.log"), std::ios::trunc | std::ios::binary);
    for (const std::string& l : lines) out << l << "\n";
  }
  static CheckpointSignerOptions SignerOptions() {
    CheckpointSignerOptions o;
    o.interval = absl::Milliseconds(20);
    return o;
  }

  std::filesystem::path dir_;
};

TEST_F(AuditTreeTest, LeavesAreTheStoredLinesAndProofsVerify) {
  auto log = OpenLog();
  ASSERT_THAT(log.status(), IsOk());
  AppendRecords(**log, 13);
  const std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 13u);
  std::vector<MerkleHash> leaves;
  for (const std::string& l : lines) leaves.push_back(HashLeaf(l));
  absl::StatusOr<MerkleHash> root = (*log)->TreeRoot(13);
  ASSERT_THAT(root.status(), IsOk());
  EXPECT_EQ(*root, RootOfLeaves(leaves));
  for (uint64_t seq = 1; seq <= 13; ++seq) {
    auto proof = (*log)->InclusionProof(seq, 13);
    ASSERT_THAT(proof.status(), IsOk());
    EXPECT_THAT(VerifyInclusion(leaves[seq - 1], seq - 1, 13, *root, *proof),
                IsOk());
  }
  auto old_root = (*log)->TreeRoot(5);
  auto consistency = (*log)->ConsistencyProof(5, 13);
  ASSERT_THAT(consistency.status(), IsOk());
  EXPECT_THAT(VerifyConsistency(5, 13, *old_root, *root, *consistency), IsOk());
  // Bad requests name their field.
  EXPECT_THAT((*log)->InclusionProof(14, 13),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("seq 14")));
  EXPECT_THAT(
      (*log)->InclusionProof(3, 14),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tree_size 14")));
  EXPECT_THAT((*log)->InclusionProof(9, 8),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("seq 9")));
  EXPECT_THAT(
      (*log)->ConsistencyProof(9, 8),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("old_size 9")));
  EXPECT_THAT(
      (*log)->ConsistencyProof(1, 99),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("new_size 99")));
}

TEST_F(AuditTreeTest, HashFileSurvivesRestartAndIsRebuiltWhenDamaged) {
  MerkleHash root;
  {
    auto log = OpenLog();
    ASSERT_THAT(log.status(), IsOk());
    AppendRecords(**log, 9);
    ASSERT_THAT((*log)->SyncTree().status(), IsOk());
    root = *(*log)->TreeRoot(9);
  }
  {
    auto log = OpenLog();
    ASSERT_THAT(log.status(), IsOk());
    EXPECT_EQ((*log)->tree_repair(), "");
    EXPECT_EQ(*(*log)->TreeRoot(9), root);
  }
  // A hash file of another log is derived data: rebuilt from the log.
  std::filesystem::resize_file(Path("audit.hashes"), 0);
  {
    std::ofstream junk(Path("audit.hashes"), std::ios::binary);
    junk << std::string(32 * 3, 'x');
  }
  auto log = OpenLog();
  ASSERT_THAT(log.status(), IsOk());
  EXPECT_THAT((*log)->tree_repair(), HasSubstr("rebuilt"));
  EXPECT_EQ(*(*log)->TreeRoot(9), root);
}

// A damaged leaf hash under intact subtree hashes leaves every root right
// and its neighbour's proofs wrong. A start that reads the whole log (here:
// the index is gone) compares every stored hash and rewrites from there.
TEST_F(AuditTreeTest, ADamagedLeafUnderIntactSubtreesIsFoundAndRewritten) {
  {
    auto log = OpenLog();
    ASSERT_THAT(log.status(), IsOk());
    AppendRecords(**log, 8);
    ASSERT_THAT((*log)->SyncTree().status(), IsOk());
  }
  std::vector<MerkleHash> leaves;
  for (const std::string& l : Lines()) leaves.push_back(HashLeaf(l));
  ASSERT_EQ(leaves.size(), 8u);
  {
    // Leaf 3 (seq 3) is stored at index 3, after leaves 1, 2 and their
    // parent.
    std::fstream hashes(Path("audit.hashes"),
                        std::ios::in | std::ios::out | std::ios::binary);
    hashes.seekp(3 * 32);
    hashes.write(std::string(32, 'x').data(), 32);
  }
  std::filesystem::remove(Path("audit.index"));
  auto log = OpenLog();
  ASSERT_THAT(log.status(), IsOk());
  EXPECT_THAT((*log)->tree_repair(), HasSubstr("from seq 3"));
  const MerkleHash root = RootOfLeaves(leaves);
  EXPECT_EQ(*(*log)->TreeRoot(8), root);
  for (uint64_t seq = 1; seq <= 8; ++seq) {
    auto proof = (*log)->InclusionProof(seq, 8);
    ASSERT_THAT(proof.status(), IsOk());
    EXPECT_THAT(VerifyInclusion(leaves[seq - 1], seq - 1, 8, root, *proof),
                IsOk())
        << "seq " << seq;
  }
}

TEST_F(AuditTreeTest, StartRefusesALogCutBelowTheLastCheckpoint) {
  {
    auto log = OpenLog();
    ASSERT_THAT(log.status(), IsOk());
    AppendRecords(**log, 12);
    auto key = Ed25519PrivateKey::Generate();
    auto signer = CheckpointSigner::Create(log->get(), *key, SignerOptions());
    ASSERT_THAT(signer.status(), IsOk());
    EXPECT_EQ((*signer)->LatestCheckpoint().size, 12u);
  }
  std::vector<std::string> lines = Lines();
  lines.resize(7);  // the last 5 records cut off
  WriteLines(lines);
  EXPECT_THAT(OpenLog(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("tree size 12"),
                             HasSubstr("has 7 records"), HasSubstr("seq 8"))));
}

TEST_F(AuditTreeTest, StartRefusesARewrittenLogNamingTheFirstDifference) {
  {
    auto log = OpenLog();
    ASSERT_THAT(log.status(), IsOk());
    AppendRecords(**log, 10);
    auto key = Ed25519PrivateKey::Generate();
    ASSERT_THAT(
        CheckpointSigner::Create(log->get(), *key, SignerOptions()).status(),
        IsOk());
  }
  // Rewrite from seq 6 on, with a valid chain: a new log of 10 records
  // whose first 5 are the old ones.
  std::vector<std::string> lines = Lines();
  lines.resize(5);
  WriteLines(lines);
  std::filesystem::rename(Path("audit.checkpoint"), Path("saved"));
  {
    // Opened without the checkpoint file, so the rewrite is possible.
    auto log =
        AuditLog::Open(Path("audit.log"), {Path("other.hashes"), "", ""});
    ASSERT_THAT(log.status(), IsOk());
    AppendRecords(**log, 5);
  }
  std::filesystem::rename(Path("saved"), Path("audit.checkpoint"));
  EXPECT_THAT(OpenLog(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                  AllOf(HasSubstr("rewritten"),
                                        HasSubstr("first differing record is "
                                                  "seq 6"))));
}

// Offline (`audit verify --file --key`): a record changed in place breaks
// the chain there, and the log's tree still has every line, so the
// comparison with the checkpoint says rewritten, not cut off.
TEST_F(AuditTreeTest, OfflineCheckOfARecordChangedInPlaceSaysRewritten) {
  Checkpoint checkpoint;
  {
    auto log = OpenLog();
    ASSERT_THAT(log.status(), IsOk());
    AppendRecords(**log, 10);
    auto key = Ed25519PrivateKey::Generate();
    auto signer = CheckpointSigner::Create(log->get(), *key, SignerOptions());
    ASSERT_THAT(signer.status(), IsOk());
    checkpoint = (*signer)->LatestCheckpoint();
  }
  ASSERT_EQ(checkpoint.size, 10u);
  std::vector<std::string> lines = Lines();
  const size_t at = lines[2].find("\"type\":\"") + 8;
  lines[2][at] = lines[2][at] == 'x' ? 'y' : 'x';
  WriteLines(lines);
  std::vector<MerkleHash> leaves;
  auto chain = AuditLog::Verify(Path("audit.log"), &leaves);
  ASSERT_THAT(chain.status(), IsOk());
  EXPECT_FALSE(chain->ok);
  EXPECT_EQ(chain->broken_seq, 3u);
  EXPECT_EQ(leaves.size(), 10u);
  CheckpointComparison cmp =
      CompareWithCheckpoint(leaves, checkpoint, nullptr, 0);
  EXPECT_FALSE(cmp.ok);
  EXPECT_THAT(cmp.problem, HasSubstr("rewritten"));
  EXPECT_THAT(cmp.problem, ::testing::Not(HasSubstr("cut off")));
}

TEST_F(AuditTreeTest, SignerSignsWhileRecordsArriveAndTakesCosignatures) {
  auto log = OpenLog();
  ASSERT_THAT(log.status(), IsOk());
  auto key = Ed25519PrivateKey::Generate();
  auto witness_key = Ed25519PrivateKey::Generate();
  auto witness = CosignatureSigner::Create("witness.example", *witness_key);
  auto stranger = CosignatureSigner::Create("stranger", *witness_key);
  ASSERT_THAT(witness.status(), IsOk());
  CheckpointSignerOptions options = SignerOptions();
  options.witnesses.push_back(witness->verifier_key());
  auto signer = CheckpointSigner::Create(log->get(), *key, options);
  ASSERT_THAT(signer.status(), IsOk());
  EXPECT_EQ((*signer)->LatestCheckpoint().size, 0u);
  (*signer)->Start();
  AppendRecords(**log, 4);
  for (int i = 0; i < 200 && (*signer)->LatestCheckpoint().size < 4; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ((*signer)->LatestCheckpoint().size, 4u);
  // The signed note opens with the log's verifier key and is durable.
  const std::string note = (*signer)->Latest();
  auto verifier = Ed25519NoteVerifier::Parse((*signer)->verifier_key());
  ASSERT_THAT(verifier.status(), IsOk());
  const NoteVerifier* verifiers[] = {&*verifier};
  auto opened = OpenCheckpoint(note, verifiers);
  ASSERT_THAT(opened.status(), IsOk());
  EXPECT_EQ(opened->checkpoint.root, *(*log)->TreeRoot(4));
  EXPECT_EQ(*ReadFile(Path("audit.checkpoint")), note);

  // Cosignatures: a configured witness's is attached; a stranger's, a bad
  // one, or one on a root the log never had is refused and changes nothing.
  auto cosigned = CosignCheckpoint(note, *witness, 1700000000);
  ASSERT_THAT(cosigned.status(), IsOk());
  auto by_stranger = CosignCheckpoint(note, *stranger, 1700000000);
  EXPECT_THAT((*signer)->AddCosignature(*by_stranger),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("not from a key configured as a witness")));
  std::string tampered = *cosigned;
  tampered[tampered.size() - 3] =
      tampered[tampered.size() - 3] == 'A' ? 'B' : 'A';
  EXPECT_THAT((*signer)->AddCosignature(tampered),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("does not verify")));
  EXPECT_THAT(
      (*signer)->AddCosignature("not a note"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("checkpoint")));
  Checkpoint forged = opened->checkpoint;
  forged.root[0] ^= 1;
  auto forged_note = SignCheckpoint(
      forged, *Ed25519NoteSigner::Create("modelstate/audit", *key));
  auto forged_cosigned = CosignCheckpoint(*forged_note, *witness, 1);
  EXPECT_THAT((*signer)->AddCosignature(*forged_cosigned),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("never had root")));
  EXPECT_EQ((*signer)->Latest(), note);

  auto latest = (*signer)->AddCosignature(*cosigned);
  ASSERT_THAT(latest.status(), IsOk());
  EXPECT_EQ(*latest, *cosigned);
  EXPECT_EQ((*signer)->Latest(), *cosigned);
  (*signer)->Stop();
}

}  // namespace
}  // namespace modelstate

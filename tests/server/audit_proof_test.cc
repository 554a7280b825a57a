// The verifiable audit log through the RPCs, against a server in the test
// process: signed checkpoints, inclusion and consistency proofs that verify
// against them, bad requests naming their field, the signing key created
// with mode 0600, and a restart that refuses a log cut below its last
// checkpoint.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/checkpoint.h"
#include "base/file_util.h"
#include "base/merkle.h"
#include "base/signed_note.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "service/audit_tree.h"
#include "service/data_dir.h"
#include "tests/testing/in_process_server.h"
#include "tests/testing/requests.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::BuildRequest;
using ::modelstate::testing::InProcessServer;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kSpec[] = R"({"type": "Linear", "args": [3, 2]})";

Checkpoint Open(const v1::GetCheckpointResponse& response) {
  auto verifier = Ed25519NoteVerifier::Parse(response.verifier_key());
  EXPECT_THAT(verifier.status(), IsOk());
  const NoteVerifier* verifiers[] = {&*verifier};
  auto opened = OpenCheckpoint(response.checkpoint(), verifiers);
  EXPECT_THAT(opened.status(), IsOk());
  return opened.ok() ? opened->checkpoint : Checkpoint{};
}

std::vector<MerkleHash> Hashes(
    const google::protobuf::RepeatedPtrField<std::string>& proof) {
  std::vector<MerkleHash> out;
  for (const std::string& h : proof) {
    out.push_back(*MerkleHashFromBytes(h, "proof"));
  }
  return out;
}

TEST(AuditSeqsTrailerTest, RunsRoundTripAndTheTextStaysBounded) {
  const std::vector<uint64_t> seqs = {3, 12, 13, 14, 20, 21, 40};
  EXPECT_EQ(convert::AuditSeqsTrailer(seqs), "3,12-14,20-21,40");
  EXPECT_THAT(convert::ParseAuditSeqsTrailer("3,12-14,20-21,40"),
              ::testing::ElementsAreArray(seqs));
  EXPECT_EQ(convert::AuditSeqsTrailer({}), "");
  // A governed build writes thousands of records, interleaved with other
  // calls' records: the text keeps to its bound and says it left runs out.
  std::vector<uint64_t> interleaved;
  for (uint64_t i = 0; i < 5000; ++i) interleaved.push_back(1'000'000 + 2 * i);
  const std::string text = convert::AuditSeqsTrailer(interleaved);
  EXPECT_LE(text.size(), convert::kMaxAuditSeqsTrailerBytes);
  EXPECT_TRUE(absl::EndsWith(text, ",more"));
  bool truncated = false;
  std::vector<uint64_t> parsed =
      convert::ParseAuditSeqsTrailer(text, &truncated);
  EXPECT_TRUE(truncated);
  ASSERT_FALSE(parsed.empty());
  EXPECT_THAT(parsed,
              ::testing::ElementsAreArray(interleaved.begin(),
                                          interleaved.begin() + parsed.size()));
  // Nothing malformed or huge is expanded.
  EXPECT_THAT(convert::ParseAuditSeqsTrailer("x,5-3,1-99999999999,7,-,8-"),
              ::testing::ElementsAre(7));
}

// A build of a thousand layers writes thousands of records: the call
// succeeds (its trailer once exceeded gRPC's 8 KiB metadata limit), and the
// response lists every record.
TEST(AuditProofTest, ABuildWithThousandsOfRecordsNamesThemAll) {
  InProcessServer server;
  ASSERT_THAT(server.Start(), IsOk());
  auto client = server.NewClient();
  std::string spec = R"({"type": "Sequential", "children": [)";
  for (int i = 0; i < 1000; ++i) {
    absl::StrAppend(&spec, i == 0 ? "" : ",",
                    R"({"spec": {"type": "Linear", "args": [2, 2]}})");
  }
  spec += "]}";
  auto built = client->BuildModule(BuildRequest("team/wide", spec));
  ASSERT_THAT(built.status(), IsOk());
  EXPECT_GE(built->audit_seqs_size(), 3000);
  const std::vector<uint64_t> from_trailer = client->last_audit_seqs();
  ASSERT_FALSE(from_trailer.empty());
  EXPECT_THAT(from_trailer,
              ::testing::ElementsAreArray(
                  built->audit_seqs().begin(),
                  built->audit_seqs().begin() + from_trailer.size()));
}

TEST(AuditProofTest, CheckpointsAndProofsVerify) {
  InProcessServer server;
  ASSERT_THAT(server.Start(), IsOk());
  auto client = server.NewClient();
  auto built = client->BuildModule(BuildRequest("team/a", kSpec));
  ASSERT_THAT(built.status(), IsOk());
  // The response named the records the build wrote, in its audit_seqs
  // field and in its trailing metadata.
  const std::vector<uint64_t> build_seqs = client->last_audit_seqs();
  ASSERT_FALSE(build_seqs.empty());
  EXPECT_THAT(built->audit_seqs(), ::testing::ElementsAreArray(build_seqs));
  auto first = client->GetCheckpoint(/*fresh=*/true);
  ASSERT_THAT(first.status(), IsOk());
  const Checkpoint old_cp = Open(*first);
  ASSERT_GT(old_cp.size, 0u);
  EXPECT_EQ(old_cp.origin, "modelstate/audit");
  ASSERT_THAT(client->BuildModule(BuildRequest("team/b", kSpec)).status(),
              IsOk());
  auto second = client->GetCheckpoint(/*fresh=*/true);
  ASSERT_THAT(second.status(), IsOk());
  const Checkpoint new_cp = Open(*second);
  ASSERT_GT(new_cp.size, old_cp.size);

  for (uint64_t seq = 1; seq <= new_cp.size; ++seq) {
    auto inclusion = client->GetInclusionProof(seq, new_cp.size);
    ASSERT_THAT(inclusion.status(), IsOk());
    const MerkleHash leaf = AuditLeafHash(inclusion->record_line());
    EXPECT_EQ(inclusion->leaf_hash(),
              std::string(reinterpret_cast<const char*>(leaf.data()), 32));
    EXPECT_THAT(VerifyInclusion(leaf, seq - 1, new_cp.size, new_cp.root,
                                Hashes(inclusion->proof())),
                IsOk())
        << "seq " << seq;
  }
  for (uint64_t seq : build_seqs) {
    auto inclusion = client->GetInclusionProof(seq, new_cp.size);
    ASSERT_THAT(inclusion.status(), IsOk());
    EXPECT_THAT(inclusion->record_line(),
                AllOf(HasSubstr("\"namespace\":\"team\""),
                      HasSubstr("\"module\":\"a\"")));
  }
  EXPECT_TRUE(client->last_audit_seqs().empty());  // reads write none
  auto consistency = client->GetConsistencyProof(old_cp.size, new_cp.size);
  ASSERT_THAT(consistency.status(), IsOk());
  EXPECT_THAT(VerifyConsistency(old_cp.size, new_cp.size, old_cp.root,
                                new_cp.root, Hashes(consistency->proof())),
              IsOk());

  // Bad requests name their field; nothing is attached.
  EXPECT_THAT(client->GetInclusionProof(new_cp.size + 100, 0),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("seq")));
  EXPECT_THAT(
      client->GetInclusionProof(1, new_cp.size + 100),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tree_size")));
  EXPECT_THAT(
      client->GetConsistencyProof(1, new_cp.size + 100),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("new_size")));
  EXPECT_THAT(
      client->GetConsistencyProof(3, 2),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("old_size")));
  EXPECT_THAT(
      client->AddCosignature("garbage"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("checkpoint")));
  // The log's own signature is no witness cosignature.
  EXPECT_THAT(client->AddCosignature(second->checkpoint()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no witness cosignature")));

  // The key was created owner-only, and the latest checkpoint is durable.
  struct stat st;
  ASSERT_EQ(
      ::stat(data_dir::AuditKeyPath(server.data_dir().string()).c_str(), &st),
      0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_EQ(
      *ReadFile(data_dir::AuditCheckpointPath(server.data_dir().string())),
      second->checkpoint());
}

TEST(AuditProofTest, RestartRefusesALogCutBelowItsLastCheckpoint) {
  InProcessServer server;
  ASSERT_THAT(server.Start(), IsOk());
  {
    auto client = server.NewClient();
    for (const char* name : {"team/a", "team/b", "team/c"}) {
      ASSERT_THAT(client->BuildModule(BuildRequest(name, kSpec)).status(),
                  IsOk());
    }
  }
  server.Stop();  // signs a last checkpoint over every record
  const std::string log_path =
      data_dir::AuditLogPath(server.data_dir().string());
  std::vector<std::string> lines =
      absl::StrSplit(*ReadFile(log_path), '\n', absl::SkipEmpty());
  const size_t n = lines.size();
  ASSERT_GT(n, 5u);
  {
    std::ofstream out(log_path, std::ios::trunc | std::ios::binary);
    for (size_t i = 0; i + 5 < n; ++i) out << lines[i] << "\n";
  }
  EXPECT_THAT(
      server.Start(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr(absl::StrCat("tree size ", n)),
                     HasSubstr(absl::StrCat("has ", n - 5, " records")))));
}

TEST(AuditProofTest, RestartRefusesALogShorterThanAManifestRecorded) {
  InProcessServer server;
  ASSERT_THAT(server.Start(), IsOk());
  {
    auto client = server.NewClient();
    for (const char* name : {"team/a", "team/b", "team/c"}) {
      ASSERT_THAT(client->BuildModule(BuildRequest(name, kSpec)).status(),
                  IsOk());
    }
  }
  server.Stop();
  // Without the checkpoint file, the manifests still know how long the log
  // was: cut it to its first record.
  const std::string dir = server.data_dir().string();
  std::filesystem::remove(data_dir::AuditCheckpointPath(dir));
  const std::string log_path = data_dir::AuditLogPath(dir);
  std::vector<std::string> lines =
      absl::StrSplit(*ReadFile(log_path), '\n', absl::SkipEmpty());
  {
    std::ofstream out(log_path, std::ios::trunc | std::ios::binary);
    out << lines[0] << "\n";
  }
  EXPECT_THAT(server.Start(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("the audit log has 1 records"),
                             HasSubstr("manifest of 'team/"))));
}

}  // namespace
}  // namespace modelstate

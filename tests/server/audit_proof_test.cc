// The verifiable audit log through the RPCs, against a server in the test
// process: the records each call names, signed checkpoints, inclusion and
// consistency proofs that verify against them, witness cosignatures, bad
// requests naming their field (client text cut short), attestations held
// to the message limit, the signing key created with mode 0600, and a
// restart that refuses a log cut below its last checkpoint.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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

// A Sequential of `children` Linear(1, 1) layers, whose build writes six
// audit records per layer and one more.
std::string WideSpec(int children) {
  std::string spec = R"({"type": "Sequential", "children": [)";
  for (int i = 0; i < children; ++i) {
    absl::StrAppend(&spec, i == 0 ? "" : ",",
                    R"({"spec": {"type": "Linear", "args": [1, 1]}})");
  }
  return spec + "]}";
}

// A build of 1,700 layers writes more than 10,000 records, more than one
// page of an audit query: the call succeeds (its trailer once exceeded
// gRPC's 8 KiB metadata limit), the response lists every record (it once
// stopped at 10,000), and the trailer names the first ones.
TEST(AuditProofTest, ABuildWithThousandsOfRecordsNamesThemAll) {
  InProcessServer server;
  ASSERT_THAT(server.Start(), IsOk());
  auto client = server.NewClient();
  const uint64_t mark = server.server().audit_log().last_seq();
  auto built = client->BuildModule(BuildRequest("team/wide", WideSpec(1700)));
  ASSERT_THAT(built.status(), IsOk());
  const uint64_t last = server.server().audit_log().last_seq();
  ASSERT_GT(last - mark, 10000u);
  std::vector<uint64_t> written;
  for (uint64_t seq = mark + 1; seq <= last; ++seq) written.push_back(seq);
  EXPECT_THAT(built->audit_seqs(), ::testing::ElementsAreArray(written));
  const std::vector<uint64_t> from_trailer = client->last_audit_seqs();
  ASSERT_FALSE(from_trailer.empty());
  EXPECT_THAT(from_trailer,
              ::testing::ElementsAreArray(
                  built->audit_seqs().begin(),
                  built->audit_seqs().begin() + from_trailer.size()));
}

// The client chooses x-request-id (the records' correlation_id), so
// concurrent calls may share one: each response still names only the
// records its own call wrote.
TEST(AuditProofTest, CallsSharingARequestIdNameOnlyTheirOwnRecords) {
  InProcessServer server;
  ASSERT_THAT(server.Start(), IsOk());
  constexpr int kThreads = 4;
  constexpr int kBuilds = 15;
  struct Built {
    std::string module;
    std::vector<uint64_t> seqs;
  };
  std::vector<std::vector<Built>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto client = server.NewClient();
      for (int i = 0; i < kBuilds; ++i) {
        v1::BuildModuleRequest request =
            BuildRequest(absl::StrCat("w", t, "/m", i),
                         R"({"type": "Sequential", "children": [
                  {"spec": {"type": "Linear", "args": [3, 2]}},
                  {"spec": {"type": "Linear", "args": [2, 2]}}]})");
        auto context = client->NewContext(absl::Seconds(30));
        context->AddMetadata("x-request-id", "same-id");
        v1::BuildModuleResponse response;
        grpc::Status status =
            client->stub().BuildModule(context.get(), request, &response);
        EXPECT_TRUE(status.ok()) << status.error_message();
        results[t].push_back(
            {request.module(),
             {response.audit_seqs().begin(), response.audit_seqs().end()}});
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::vector<Built>& built : results) {
    for (const Built& b : built) {
      EXPECT_FALSE(b.seqs.empty()) << b.module;
      for (uint64_t seq : b.seqs) {
        auto record = server.server().audit_log().Get(seq);
        ASSERT_THAT(record.status(), IsOk());
        EXPECT_EQ(absl::StrCat(record->ns, "/", record->module), b.module)
            << "seq " << seq << " (" << record->type << ")";
        EXPECT_EQ(record->correlation_id, "same-id");
      }
    }
  }
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

// A witness's cosignature is kept per witness key, newest first: a replayed
// older one (or one the log never signed) never replaces the cosignature
// of the latest checkpoint the server serves.
TEST(AuditProofTest, AnOlderCosignatureNeverReplacesAWitnesssNewerOne) {
  auto witness_key = Ed25519PrivateKey::Generate();
  ASSERT_THAT(witness_key.status(), IsOk());
  auto witness = CosignatureSigner::Create("witness.example/w1", *witness_key);
  ASSERT_THAT(witness.status(), IsOk());
  InProcessServer server;
  const std::string keys = (server.dir() / "witnesses.txt").string();
  std::ofstream(keys) << FormatVerifierKey(witness->verifier_key()) << "\n";
  server.set_configure([&](server::ServerConfig& config) {
    config.audit_witness_keys_file = keys;
  });
  ASSERT_THAT(server.Start(), IsOk());
  auto client = server.NewClient();
  const uint64_t now = static_cast<uint64_t>(absl::ToUnixSeconds(absl::Now()));

  ASSERT_THAT(client->BuildModule(BuildRequest("team/a", kSpec)).status(),
              IsOk());
  auto first = client->GetCheckpoint(/*fresh=*/true);
  ASSERT_THAT(first.status(), IsOk());
  auto first_cosigned = CosignCheckpoint(first->checkpoint(), *witness, now);
  ASSERT_THAT(client->AddCosignature(*first_cosigned).status(), IsOk());
  ASSERT_THAT(client->BuildModule(BuildRequest("team/b", kSpec)).status(),
              IsOk());
  auto second = client->GetCheckpoint(/*fresh=*/true);
  ASSERT_THAT(second.status(), IsOk());
  auto second_cosigned =
      CosignCheckpoint(second->checkpoint(), *witness, now + 1);
  ASSERT_THAT(client->AddCosignature(*second_cosigned).status(), IsOk());
  ASSERT_EQ(client->GetCheckpoint()->checkpoint(), *second_cosigned);

  // The first one again: refused, and the served checkpoint keeps its
  // cosignature.
  EXPECT_THAT(client->AddCosignature(*first_cosigned),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("witness.example/w1"),
                             HasSubstr("already cosigned tree size "),
                             HasSubstr("older"))));
  EXPECT_EQ(client->GetCheckpoint()->checkpoint(), *second_cosigned);
  // So is the same checkpoint cosigned at an earlier time.
  auto earlier = CosignCheckpoint(second->checkpoint(), *witness, now - 60);
  EXPECT_THAT(client->AddCosignature(*earlier),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // The very same cosignature again changes nothing and is no error (a
  // witness retrying), and a later one of the same tree replaces it.
  EXPECT_THAT(client->AddCosignature(*second_cosigned).status(), IsOk());
  auto later = CosignCheckpoint(second->checkpoint(), *witness, now + 2);
  EXPECT_THAT(client->AddCosignature(*later).status(), IsOk());
  EXPECT_EQ(client->GetCheckpoint()->checkpoint(), *later);

  // A checkpoint text without the log's signature (here the first tree's,
  // a root the log had) is not taken, whatever the witness signed.
  auto text = ParseSignedNote(first->checkpoint());
  ASSERT_THAT(text.status(), IsOk());
  const NoteSigner* signers[] = {&*witness};
  auto unsigned_by_log = SignNote(text->text, signers);
  ASSERT_THAT(unsigned_by_log.status(), IsOk());
  EXPECT_THAT(client->AddCosignature(*unsigned_by_log),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no valid signature by this log's key")));
  EXPECT_EQ(client->GetCheckpoint()->checkpoint(), *later);
}

// A client's text in an error is cut: a 200 KiB module name or checkpoint
// origin once came back whole in grpc-message, which clients refuse over
// 8 KiB (they saw RESOURCE_EXHAUSTED instead of INVALID_ARGUMENT).
TEST(AuditProofTest, ErrorsQuoteLongClientTextCutShort) {
  InProcessServer server;
  ASSERT_THAT(server.Start(), IsOk());
  auto client = server.NewClient();
  const std::string big(200 << 10, 'a');
  absl::Status attested = client->AttestModule(big).status();
  EXPECT_THAT(attested, StatusIs(absl::StatusCode::kInvalidArgument,
                                 AllOf(HasSubstr("module: 'aaa"),
                                       HasSubstr("(204800 bytes)"))));
  EXPECT_LT(attested.message().size(), 1024u);

  auto latest = client->GetCheckpoint(/*fresh=*/true);
  ASSERT_THAT(latest.status(), IsOk());
  auto note = ParseSignedNote(latest->checkpoint());
  ASSERT_THAT(note.status(), IsOk());
  std::vector<std::string> lines = absl::StrSplit(note->text, '\n');
  std::string other_origin =
      absl::StrCat(big, "\n", lines[1], "\n", lines[2], "\n\n");
  for (const NoteSignature& s : note->signatures) {
    other_origin += FormatSignatureLine(s);
  }
  absl::Status cosigned = client->AddCosignature(other_origin).status();
  EXPECT_THAT(cosigned, StatusIs(absl::StatusCode::kInvalidArgument,
                                 AllOf(HasSubstr("origin 'aaa"),
                                       HasSubstr("(204800 bytes)"))));
  EXPECT_LT(cosigned.message().size(), 1024u);
}

// An attestation cites every record that shaped the module, so it grows
// with them; one that would not fit in a response is refused naming the
// limit, not by gRPC's own "larger than max" on the way out.
TEST(AuditProofTest, AnAttestationOverTheMessageLimitNamesTheLimit) {
  InProcessServer server([](server::ServerConfig& config) {
    config.limits.max_message_bytes = 1 << 20;
  });
  ASSERT_THAT(server.Start(), IsOk());
  auto client = server.NewClient();
  ASSERT_THAT(
      client->BuildModule(BuildRequest("team/wide", WideSpec(1200))).status(),
      IsOk());
  EXPECT_THAT(client->AttestModule("team/wide").status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("over the max_message_bytes limit of "
                                 "1048576")));
  // A small module still fits.
  ASSERT_THAT(client->BuildModule(BuildRequest("team/a", kSpec)).status(),
              IsOk());
  EXPECT_THAT(client->AttestModule("team/a").status(), IsOk());
}

}  // namespace
}  // namespace modelstate

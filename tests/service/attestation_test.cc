// Attestations: the statement formats (base/attestation), which records
// shaped a module, and AttestModule against a real server in the test
// process, checked with the CLI's verify-attestation: a good envelope
// verifies against a safetensors file, the live module and the log; a bad
// signature, a changed tensor, a record the log does not have and a
// missing module each fail naming what failed.
#include "base/attestation.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/checkpoint.h"
#include "base/dsse.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "client/cli.h"
#include "core/safetensors.h"
#include "core/state_digest.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "service/attestation.h"
#include "service/audit_events.h"
#include "service/module_repository.h"
#include "tests/testing/in_process_server.h"
#include "tests/testing/requests.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace modelstate {
namespace {

using ::modelstate::testing::BuildRequest;
using ::modelstate::testing::InProcessServer;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::ParseJson;
using ::modelstate::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(AttestationFormatTest, StatementRoundTripsAndRejectsBadDigests) {
  InTotoStatement s;
  s.subjects.push_back({"w", Sha256Hex("abc"), R"({"dtype":"float32"})"});
  s.predicate_type = std::string(kSlsaProvenanceV1);
  s.predicate_json = R"({"buildDefinition":{}})";
  auto json = InTotoStatementToJson(s);
  ASSERT_THAT(json.status(), IsOk());
  EXPECT_THAT(*json, HasSubstr(R"("_type":"https://in-toto.io/Statement/v1")"));
  auto back = InTotoStatementFromJson(*json);
  ASSERT_THAT(back.status(), IsOk());
  ASSERT_EQ(back->subjects.size(), 1u);
  EXPECT_EQ(back->subjects[0].sha256, Sha256Hex("abc"));
  EXPECT_EQ(back->predicate_type, kSlsaProvenanceV1);

  s.subjects[0].sha256 = "xyz";
  EXPECT_THAT(
      InTotoStatementToJson(s).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("subject[0]")));
  EXPECT_THAT(InTotoStatementFromJson(R"({"_type":"other"})").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("_type")));
  // A member of another type is a mismatch too, never an exception.
  EXPECT_THAT(InTotoStatementFromJson(R"({"_type":5})").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("_type")));
}

TEST(AttestationFormatTest, ParallelHashesEqualSerialOnes) {
  std::vector<std::string> data = {std::string(1 << 20, 'a'), "", "b",
                                   std::string(3000, 'c')};
  std::vector<absl::string_view> views(data.begin(), data.end());
  std::vector<std::string> digests = Sha256HexAll(views, 3);
  ASSERT_EQ(digests.size(), data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    EXPECT_EQ(digests[i], Sha256Hex(data[i])) << i;
  }
}

TEST(AttestationFormatTest, OmsBundleVerifiesAndDetectsTampering) {
  auto key = Ed25519PrivateKey::FromSeed(std::string(32, '\x07'));
  ASSERT_THAT(key.status(), IsOk());
  auto bundle = SignOmsBundle(
      "m",
      {{"b.safetensors", Sha256Hex("b"), ""}, {"a.json", Sha256Hex("a"), ""}},
      *key);
  ASSERT_THAT(bundle.status(), IsOk());
  auto files = VerifyOmsBundle(*bundle, key->public_key());
  ASSERT_THAT(files.status(), IsOk());
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].name, "a.json");  // canonical order: by name
  // The subject is the SHA-256 over the raw digests in that order.
  auto env =
      DsseFromJson(nlohmann::json::parse(*bundle)["dsseEnvelope"].dump());
  ASSERT_THAT(env.status(), IsOk());
  auto statement = InTotoStatementFromJson(env->payload);
  ASSERT_THAT(statement.status(), IsOk());
  EXPECT_EQ(statement->subjects[0].sha256,
            Sha256Hex(absl::HexStringToBytes(Sha256Hex("a")) +
                      absl::HexStringToBytes(Sha256Hex("b"))));
  auto other = Ed25519PrivateKey::FromSeed(std::string(32, '\x08'));
  EXPECT_THAT(VerifyOmsBundle(*bundle, other->public_key()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));

  // The same statement, validly signed as another payload type: DSSE says
  // a verifier rejects a type it does not expect.
  auto retyped = SignDsse("text/plain", env->payload, *key);
  ASSERT_THAT(retyped.status(), IsOk());
  nlohmann::json wrong_type = nlohmann::json::parse(*bundle);
  wrong_type["dsseEnvelope"] = nlohmann::json::parse(DsseToJson(*retyped));
  EXPECT_THAT(
      VerifyOmsBundle(wrong_type.dump(), key->public_key()).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("payloadType")));

  // Members of another type, before the signature is checked (anyone's
  // file) and in a validly signed predicate: errors, never exceptions.
  nlohmann::json numeric_type = nlohmann::json::parse(*bundle);
  numeric_type["mediaType"] = 3;
  EXPECT_THAT(
      VerifyOmsBundle(numeric_type.dump(), key->public_key()).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mediaType")));
  for (const char* pointer : {"/predicate/serialization/method",
                              "/predicate/resources/0/algorithm"}) {
    SCOPED_TRACE(pointer);
    nlohmann::json payload = nlohmann::json::parse(env->payload);
    payload[nlohmann::json::json_pointer(pointer)] = 1;
    auto resigned = SignDsse(kInTotoPayloadType, payload.dump(), *key);
    ASSERT_THAT(resigned.status(), IsOk());
    nlohmann::json numeric = nlohmann::json::parse(*bundle);
    numeric["dsseEnvelope"] = nlohmann::json::parse(DsseToJson(*resigned));
    EXPECT_THAT(
        VerifyOmsBundle(numeric.dump(), key->public_key()).status(),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("predicate")));
  }
}

// nlohmann/json copies and dumps recursively: a bundle (anyone's file,
// read before its signature is checked) or a statement nested 300000 deep
// overflowed the verifier's stack. Too deep is an error naming it.
TEST(AttestationFormatTest, DeepNestingIsRefusedNotACrash) {
  const int depth = 300000;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  const std::string bundle =
      absl::StrCat(R"({"mediaType":")", kSigstoreBundleMediaType,
                   R"(","dsseEnvelope":{"payloadType":"x","x":)", deep, "}}");
  auto key = Ed25519PrivateKey::FromSeed(std::string(32, '\x07'));
  ASSERT_THAT(key.status(), IsOk());
  EXPECT_THAT(VerifyOmsBundle(bundle, key->public_key()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("nests deeper than 128 levels")));
  const std::string statement = absl::StrCat(
      R"({"_type":")", kInTotoStatementType,
      R"(","subject":[{"name":"w","digest":{"sha256":")", Sha256Hex("w"),
      R"("},"annotations":{"a":)", deep, R"(}}],"predicateType":")",
      kSlsaProvenanceV1, R"(","predicate":{}})");
  EXPECT_THAT(InTotoStatementFromJson(statement).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("nests deeper than 128 levels")));
  // Brackets inside strings do not count; 128 levels are read.
  EXPECT_FALSE(JsonNestedDeeperThan(R"({"a":"[[[[\"[["})", 1));
  EXPECT_TRUE(JsonNestedDeeperThan(R"({"a":[]})", 1));
  const std::string deepest =
      std::string(127, '[') + "{}" + std::string(127, ']');
  EXPECT_FALSE(JsonNestedDeeperThan(deepest, kMaxStatementJsonDepth));
  EXPECT_TRUE(
      JsonNestedDeeperThan("[" + deepest + "]", kMaxStatementJsonDepth));
}

TEST(BuildRecordTest, TheSpecIsRecordedWithItsArgumentsAndDigest) {
  ModuleSpec custom;
  custom.type = "Gate";
  custom.custom = true;
  MemberSpec weight;
  weight.kind = EntryKind::kParameter;
  weight.name = "w";
  weight.tensor.data = testing::Filled(DType::kFloat32, {2, 2}, 0.5);
  custom.members.push_back(weight);
  MemberSpec scale;
  scale.kind = EntryKind::kBuffer;
  scale.name = "scale";
  scale.persistent = false;
  scale.tensor.shape = {3};
  scale.tensor.init.kind = InitSpec::Kind::kConstant;
  scale.tensor.init.a = 2;
  custom.members.push_back(scale);
  ModuleSpec net = ModuleSpec::Layer("Sequential");
  net.children.push_back(
      {"", ModuleSpec::Layer("Linear", {int64_t{4}, int64_t{3}},
                             {{"bias", false}})});
  net.children.push_back({"gate", custom});
  const nlohmann::json spec =
      nlohmann::json::parse(audit_events::SpecJson(net));
  EXPECT_EQ(spec["children"][0]["spec"],
            nlohmann::json::parse(
                R"({"type":"Linear","args":[4,3],"kwargs":{"bias":false}})"));
  const auto& members = spec["children"][1]["spec"]["members"];
  // Explicit values stand as the SHA-256 of their raw bytes.
  const Tensor& w = weight.tensor.data;
  EXPECT_EQ(members[0]["tensor"]["data"]["sha256"],
            Sha256Hex(absl::string_view(static_cast<const char*>(w.raw_data()),
                                        w.nbytes())));
  EXPECT_EQ(members[1]["tensor"]["init"]["kind"], "constant");
  EXPECT_EQ(members[1]["persistent"], false);

  MODELSTATE_ASSERT_OK_AND_ASSIGN(ModuleName name, ParseModuleName("team/net"));
  AuditRecord record =
      audit_events::Build(OperationContext{}, name, net, BuildOptions{}, 3, 0,
                          false, absl::OkStatus());
  auto details = nlohmann::json::parse(record.details_json);
  EXPECT_EQ(details["spec"], spec);
  EXPECT_EQ(details["spec_sha256"], audit_events::SpecSha256(net));
  EXPECT_EQ(details["spec_sha256"], Sha256Hex(spec.dump()));

  // A spec too large to hold in a record is named by its digest alone.
  ModuleSpec wide = ModuleSpec::Layer("Sequential");
  for (int i = 0; i < 3000; ++i) {
    wide.children.push_back(
        {"", ModuleSpec::Layer("Linear", {int64_t{1}, int64_t{1}})});
  }
  record = audit_events::Build(OperationContext{}, name, wide, BuildOptions{},
                               0, 0, false, absl::OkStatus());
  details = nlohmann::json::parse(record.details_json);
  EXPECT_THAT(details["spec"].get<std::string>(), HasSubstr("omitted"));
  EXPECT_EQ(details["spec_sha256"], audit_events::SpecSha256(wide));
  EXPECT_LT(record.details_json.size(), 4096u);

  // A spec nested 30 modules deep is recorded 16 deep (an audit record
  // nests at most 64 levels of JSON); its digest covers all of it.
  ModuleSpec deep = ModuleSpec::Layer("Linear", {int64_t{2}, int64_t{2}});
  for (int i = 0; i < 30; ++i) {
    ModuleSpec outer = ModuleSpec::Layer("Sequential");
    outer.children.push_back({"", std::move(deep)});
    deep = std::move(outer);
  }
  record = audit_events::Build(OperationContext{}, name, deep, BuildOptions{},
                               0, 0, false, absl::OkStatus());
  // The log accepts it (a record nested too deeply would be refused, after
  // the build it describes was stored).
  const std::string log_path = ::testing::TempDir() + "/deep_spec_audit.log";
  std::filesystem::remove(log_path);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AuditLog> log,
                                  AuditLog::Open(log_path, AuditLogOptions{}));
  EXPECT_THAT(log->Append(record), IsOk());
  log.reset();
  std::filesystem::remove(log_path);
  details = nlohmann::json::parse(record.details_json);
  EXPECT_EQ(details["spec_sha256"], audit_events::SpecSha256(deep));
  EXPECT_THAT(record.details_json, HasSubstr("nested too deep to record"));
}

TEST(AttestationRecordsTest, CurrentLifeWithoutFailuresOrDenials) {
  std::vector<AuditRecord> records(6);
  const char* types[] = {"build", "delete", "build",
                         "move",  "denied", "load_state_dict"};
  const char* outcomes[] = {"ok", "ok", "ok", "error", "", "ok"};
  for (size_t i = 0; i < records.size(); ++i) {
    records[i].seq = i + 1;
    records[i].type = types[i];
    records[i].outcome = outcomes[i];
  }
  std::vector<uint64_t> seqs;
  for (const AuditRecord& r : RecordsThatShaped(records)) seqs.push_back(r.seq);
  EXPECT_THAT(seqs, ElementsAre(3, 6));
}

// A change the log missed is recorded at the next start as "recovered",
// naming it: a recovered delete ends a life, and a recovered build begins
// one, as recorded ones do.
TEST(AttestationRecordsTest, RecoveredDeletesAndBuildsBoundALife) {
  struct Given {
    const char* type;
    const char* details;
  };
  auto shaped = [](std::vector<Given> given) {
    std::vector<AuditRecord> records(given.size());
    for (size_t i = 0; i < given.size(); ++i) {
      records[i].seq = i + 1;
      records[i].type = given[i].type;
      records[i].outcome = "ok";
      records[i].details_json = given[i].details;
    }
    std::vector<uint64_t> seqs;
    for (const AuditRecord& r : RecordsThatShaped(records)) {
      seqs.push_back(r.seq);
    }
    return seqs;
  };
  EXPECT_THAT(shaped({{"build", "{}"},
                      {"recovered", R"({"change":"delete"})"},
                      {"build", "{}"},
                      {"load_state_dict", "{}"}}),
              ElementsAre(3, 4));
  EXPECT_THAT(shaped({{"build", "{}"},
                      {"load_state_dict", "{}"},
                      {"recovered", R"({"change":"build"})"},
                      {"move", "{}"}}),
              ElementsAre(3, 4));
  // Other recovered changes shape the module like the change they name.
  EXPECT_THAT(shaped({{"build", "{}"},
                      {"recovered", R"({"change":"load_state_dict"})"},
                      {"recovered", "not json"}}),
              ElementsAre(1, 2, 3));
}

// A failed non-atomic load keeps the entries it copied before the error,
// and a failed training-mode forward the buffer updates of the layers that
// ran: those failures changed the module, and the attestation cites them.
TEST(AttestationRecordsTest, FailuresThatMayHaveChangedTheModuleAreKept) {
  const char* types[] = {"build", "load_state_dict", "load_state_dict",
                         "forward", "move"};
  const char* details[] = {"{}", R"({"atomic":true})", R"({"atomic":false})",
                           R"({"training":true})", "{}"};
  const char* outcomes[] = {"ok", "error", "error", "error", "error"};
  std::vector<AuditRecord> records(5);
  for (size_t i = 0; i < records.size(); ++i) {
    records[i].seq = i + 1;
    records[i].type = types[i];
    records[i].details_json = details[i];
    records[i].outcome = outcomes[i];
  }
  std::vector<uint64_t> seqs;
  for (const AuditRecord& r : RecordsThatShaped(records)) seqs.push_back(r.seq);
  EXPECT_THAT(seqs, ElementsAre(1, 3, 4));
}

// A module moved to another replica and back was shaped there too (a load
// in that replica's log): the statement lists both moves, naming the
// replicas, rather than show the build as the last change.
TEST(AttestationRecordsTest, ClusterMovesAreListedAsChanges) {
  const char* types[] = {"build", "move_out", "move_in"};
  const char* details[] = {R"({"seed":5,"type":"Linear"})",
                           R"({"bytes":2710,"to_replica":"r1"})",
                           R"({"bytes":2728,"from_replica":"r1"})"};
  AttestationFacts facts;
  facts.module = "team/m";
  for (int i = 0; i < 3; ++i) {
    AuditRecord r;
    r.seq = i + 5;
    r.type = types[i];
    r.outcome = "ok";
    r.ns = "team";
    r.module = "m";
    r.details_json = details[i];
    facts.records.push_back(r);
  }
  StateDict state;
  state.tensors.Set("w", testing::Zeros({2}));
  facts.state = &state;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(InTotoStatement statement,
                                  ModuleStatement(facts));
  const auto predicate = nlohmann::json::parse(statement.predicate_json);
  const auto& changes =
      predicate["buildDefinition"]["externalParameters"]["changes"];
  ASSERT_EQ(changes.size(), 2u) << changes.dump();
  EXPECT_EQ(changes[0]["type"], "move_out");
  EXPECT_EQ(changes[0]["to_replica"], "r1");
  EXPECT_EQ(changes[1]["type"], "move_in");
  EXPECT_EQ(changes[1]["from_replica"], "r1");
  EXPECT_EQ(changes[1]["seq"], 7);
}

struct CliResult {
  int code = 0;
  std::string out;
  std::string err;
};

class AttestServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_THAT(server_.Start(), IsOk());
    client_ = server_.NewClient();
  }

  CliResult Cli(std::vector<std::string> args) {
    args.insert(args.begin(), {"--server", server_.address()});
    std::ostringstream out, err;
    cli::Environment env;
    env.out = &out;
    env.err = &err;
    CliResult r;
    r.code = cli::RunCli(args, env);
    r.out = out.str();
    r.err = err.str();
    return r;
  }
  std::string Path(const std::string& name) {
    return (server_.dir() / name).string();
  }

  InProcessServer server_;
  std::unique_ptr<client::ModelStateClient> client_;
};

TEST_F(AttestServerTest, AttestationBindsDigestsAndRecords) {
  ASSERT_THAT(client_
                  ->BuildModule(BuildRequest(
                      "team/mlp", R"({"type": "Sequential", "children": [
        {"spec": {"type": "Linear", "args": [4, 3]}},
        {"spec": {"type": "BatchNorm1d", "args": [3]}}]})"))
                  .status(),
              IsOk());
  auto attested = client_->AttestModule("team/mlp");
  ASSERT_THAT(attested.status(), IsOk());
  auto key = ParseVerifierKey(attested->verifier_key());
  ASSERT_THAT(key.status(), IsOk());
  auto envelope = DsseFromJson(attested->envelope());
  ASSERT_THAT(envelope.status(), IsOk());
  ASSERT_THAT(VerifyDsse(*envelope, key->public_key), IsOk());
  auto statement = InTotoStatementFromJson(envelope->payload);
  ASSERT_THAT(statement.status(), IsOk());
  EXPECT_EQ(statement->predicate_type, kSlsaProvenanceV1);

  // Subjects: the state_dict in order, each the SHA-256 of its bytes.
  auto state = client_->GetStateDict("team/mlp");
  ASSERT_THAT(state.status(), IsOk());
  auto expected = StateDictSubjects(*state, 1);
  ASSERT_THAT(expected.status(), IsOk());
  ASSERT_EQ(statement->subjects.size(), expected->size());
  for (size_t i = 0; i < expected->size(); ++i) {
    EXPECT_EQ(statement->subjects[i].name, (*expected)[i].name);
    EXPECT_EQ(statement->subjects[i].sha256, (*expected)[i].sha256);
  }
  EXPECT_EQ(statement->subjects[0].name, "0.weight");
  EXPECT_EQ(statement->subjects[0].annotations_json,
            R"({"dtype":"float32","shape":[3,4]})");

  // The predicate: the build's parameters and its record under the
  // checkpoint it cites.
  auto predicate = nlohmann::json::parse(statement->predicate_json);
  const auto& build =
      predicate["buildDefinition"]["externalParameters"]["build"];
  EXPECT_EQ(build["type"], "Sequential");
  EXPECT_EQ(build["dtype"], "float32");
  // The whole spec, arguments included, and the digest of its text.
  EXPECT_EQ(build["spec"]["children"][0]["spec"]["args"],
            nlohmann::json::parse("[4, 3]"));
  EXPECT_EQ(build["spec"]["children"][1]["spec"]["type"], "BatchNorm1d");
  EXPECT_EQ(build["spec_sha256"], Sha256Hex(build["spec"].dump()));
  const auto& byproducts = predicate["runDetails"]["byproducts"];
  EXPECT_EQ(byproducts[0]["name"], std::string(kCheckpointByproduct));
  std::string note;
  ASSERT_TRUE(
      absl::Base64Unescape(byproducts[0]["content"].get<std::string>(), &note));
  EXPECT_EQ(note, attested->checkpoint());
  const auto& records = byproducts[1]["annotations"]["records"];
  ASSERT_FALSE(records.empty());
  // Every registration's event and outcome, then the build itself.
  EXPECT_EQ(records[0]["type"], "registration");
  EXPECT_EQ(records.back()["type"], "build");

  // The CLI: offline against a saved file and the live module, online
  // against the log.
  const std::string file = Path("mlp.safetensors");
  const std::string dsse = Path("mlp.dsse.json");
  ASSERT_EQ(Cli({"get-state", "team/mlp", "-o", file}).code, 0);
  CliResult r = Cli({"attest", "team/mlp", "-o", dsse});
  ASSERT_EQ(r.code, 0) << r.err;
  r = Cli({"verify-attestation", dsse, "--key", attested->verifier_key(),
           "--file", file, "--module", "team/mlp", "--online"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("digests: 7 entries match " + file));
  EXPECT_THAT(r.out, HasSubstr("included in the checkpoint"));
}

TEST_F(AttestServerTest, VerifyNamesWhatFailed) {
  ASSERT_THAT(client_
                  ->BuildModule(BuildRequest("team/lin", R"({"type": "Linear",
                                                         "args": [3, 2]})"))
                  .status(),
              IsOk());
  auto attested = client_->AttestModule("team/lin");
  ASSERT_THAT(attested.status(), IsOk());
  const std::string key = attested->verifier_key();
  const std::string good = Path("good.dsse.json");
  std::ofstream(good) << attested->envelope();

  // A bad signature.
  auto envelope = DsseFromJson(attested->envelope());
  ASSERT_THAT(envelope.status(), IsOk());
  envelope->signatures[0].sig[0] ^= 1;
  const std::string bad_sig = Path("bad.dsse.json");
  std::ofstream(bad_sig) << DsseToJson(*envelope);
  CliResult r = Cli({"verify-attestation", bad_sig, "--key", key});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("FAILED: signature"));

  // A digest that does not match: a changed tensor.
  const std::string file = Path("lin.safetensors");
  StateDict changed = *client_->GetStateDict("team/lin");
  changed.tensors.begin()->value =
      *Tensor::Zeros(DType::kFloat32, changed.tensors.begin()->value.shape());
  ASSERT_THAT(WriteSafetensorsFile(file, changed), IsOk());
  r = Cli({"verify-attestation", good, "--key", key, "--file", file});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("FAILED: subject 'weight'"));

  // A record the log does not have, signed with the right key.
  auto statement = InTotoStatementFromJson(envelope->payload);
  auto predicate = nlohmann::json::parse(statement->predicate_json);
  predicate["runDetails"]["byproducts"][1]["annotations"]["records"][0]["seq"] =
      999999;
  statement->predicate_json = predicate.dump();
  auto signing_key = Ed25519PrivateKey::FromPem(
      *ReadFile((server_.data_dir() / "audit.key").string()));
  if (signing_key.ok()) {
    auto forged = SignDsse(kInTotoPayloadType,
                           *InTotoStatementToJson(*statement), *signing_key);
    ASSERT_THAT(forged.status(), IsOk());
    const std::string unknown = Path("unknown.dsse.json");
    std::ofstream(unknown) << DsseToJson(*forged);
    r = Cli({"verify-attestation", unknown, "--key", key, "--online"});
    EXPECT_EQ(r.code, 1);
    EXPECT_THAT(r.out, HasSubstr("FAILED: record 999999"));
  } else {
    ADD_FAILURE() << signing_key.status();
  }

  // A module that does not exist.
  EXPECT_THAT(client_->AttestModule("team/none").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("team/none")));
  EXPECT_THAT(
      client_->AttestModule("").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("module")));
}

// What a digest of raw bytes cannot tell: another module holding the same
// bytes, and an entry whose bytes stayed while its dtype or shape changed.
// The attestation names its module and annotates each subject's dtype and
// shape, and the signature binds them: the verifier checks them, and
// rejects a payload type other than in-toto's.
TEST_F(AttestServerTest, VerifyChecksModuleDtypeShapeAndPayloadType) {
  const std::string spec = R"({"type": "Host", "custom": true, "members": [
      {"parameter": {"name": "w", "shape": [2, 4], "init": {"kind": "normal"}}},
      {"buffer": {"name": "z", "shape": [8], "init": {"kind": "zeros"}}}]})";
  // Same spec, same seed: the same bytes.
  ASSERT_THAT(client_->BuildModule(BuildRequest("team/one", spec, 7)).status(),
              IsOk());
  ASSERT_THAT(client_->BuildModule(BuildRequest("team/two", spec, 7)).status(),
              IsOk());
  auto attested = client_->AttestModule("team/one");
  ASSERT_THAT(attested.status(), IsOk());
  const std::string key = attested->verifier_key();
  const std::string dsse = Path("one.dsse.json");
  std::ofstream(dsse) << attested->envelope();
  CliResult r = Cli({"verify-attestation", dsse, "--key", key, "--module",
                     "team/one", "--online"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;

  // Another module with the same bytes is not the attested one.
  r = Cli({"verify-attestation", dsse, "--key", key, "--module", "team/two"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("FAILED: module: the attestation is of "
                               "team/one, not team/two"));

  // A file whose weight has the attested bytes as int32[4, 2].
  StateDict state = *client_->GetStateDict("team/one");
  for (auto& item : state.tensors) {
    if (item.key != "w") continue;
    auto reread = Tensor::FromBytes(DType::kInt32, {4, 2},
                                    testing::HostBytes(item.value));
    ASSERT_THAT(reread.status(), IsOk());
    item.value = *reread;
  }
  const std::string file = Path("one-reinterpreted.safetensors");
  ASSERT_THAT(WriteSafetensorsFile(file, state), IsOk());
  r = Cli({"verify-attestation", dsse, "--key", key, "--file", file});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("FAILED: subject 'w': dtype \"int32\" in " +
                               file + ", attested \"float32\""));

  // The live module changed after the attestation: its zero buffer
  // float32[8] became float16[16] zeros, the same 32 bytes.
  v1::RemoveEntryRequest remove;
  remove.set_module("team/one");
  remove.set_name("z");
  ASSERT_THAT(client_->RemoveEntry(remove).status(), IsOk());
  ASSERT_THAT(client_->RegisterBuffer(ParseJson<v1::RegisterTensorRequest>(
                  R"({"module": "team/one", "name": "z",
                      "init": {"shape": [16], "dtype": "float16",
                               "init": {"kind": "zeros"}}})")),
              IsOk());
  r = Cli({"verify-attestation", dsse, "--key", key, "--module", "team/one"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("FAILED: subject 'z': dtype \"float16\" in "
                               "module team/one, attested \"float32\""));

  // The statement, validly signed under another payload type.
  auto envelope = DsseFromJson(attested->envelope());
  ASSERT_THAT(envelope.status(), IsOk());
  auto signing_key = Ed25519PrivateKey::FromPem(
      *ReadFile((server_.data_dir() / "audit.key").string()));
  ASSERT_THAT(signing_key.status(), IsOk());
  auto retyped = SignDsse("text/plain", envelope->payload, *signing_key);
  ASSERT_THAT(retyped.status(), IsOk());
  const std::string plain = Path("plain.dsse.json");
  std::ofstream(plain) << DsseToJson(*retyped);
  r = Cli({"verify-attestation", plain, "--key", key});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("FAILED: payloadType: text/plain"));
}

// After a key rotation (README "Rotating the key") the checkpoint a
// verifier kept is signed with the old key and the latest with the new one:
// `audit consistency` checks each with its own key (--checkpoint-key for
// the old), and with one key for both it cannot check the step at all.
TEST_F(AttestServerTest, ConsistencyAcrossAKeyRotationTakesBothKeys) {
  const std::string spec = R"({"type": "Linear", "args": [2, 2]})";
  ASSERT_THAT(client_->BuildModule(BuildRequest("team/r1", spec)).status(),
              IsOk());
  CliResult r = Cli({"audit", "checkpoint", "--fresh"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string old_note = r.out;
  const std::string old_cp = Path("old.checkpoint");
  std::ofstream(old_cp) << old_note;
  auto old_size = ParseCheckpoint(ParseSignedNote(old_note)->text);
  ASSERT_THAT(old_size.status(), IsOk());
  r = Cli({"audit", "key"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string old_key(absl::StripAsciiWhitespace(r.out));

  // Stop, move the key away, start: a new key is created.
  server_.Stop();
  std::filesystem::rename(server_.data_dir() / "audit.key",
                          server_.dir() / "old.key");
  ASSERT_THAT(server_.Start(), IsOk());
  client_ = server_.NewClient();
  ASSERT_THAT(client_->BuildModule(BuildRequest("team/r2", spec)).status(),
              IsOk());
  r = Cli({"audit", "key"});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string new_key(absl::StripAsciiWhitespace(r.out));
  ASSERT_NE(new_key, old_key);
  r = Cli({"audit", "checkpoint", "--fresh", "--key", new_key});
  ASSERT_EQ(r.code, 0) << r.err;
  auto new_size = ParseCheckpoint(ParseSignedNote(r.out)->text);
  ASSERT_THAT(new_size.status(), IsOk());
  const std::string sizes[] = {absl::StrCat(old_size->size),
                               absl::StrCat(new_size->size)};

  r = Cli({"audit", "consistency", sizes[0], sizes[1], "--checkpoint", old_cp,
           "--key", new_key});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("not signed by"));
  r = Cli({"audit", "consistency", sizes[0], sizes[1], "--checkpoint", old_cp,
           "--checkpoint-key", old_key, "--key", new_key});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("ok: the tree of size " + sizes[1] +
                               " extends the checkpoint of size " + sizes[0]));
  // The old key is no key for the new checkpoint.
  r = Cli({"audit", "consistency", sizes[0], sizes[1], "--checkpoint", old_cp,
           "--checkpoint-key", old_key, "--key", old_key});
  EXPECT_EQ(r.code, 1);
}

TEST(StateDigestTest, StreamDigestSplitsEntriesAtTheirBoundaries) {
  StateDictLayout layout;
  layout.entries.push_back({"b", DType::kFloat32, {2}, 8});
  layout.entries.push_back({"empty", DType::kFloat32, {0}, 0});
  layout.entries.push_back({"a", DType::kUInt8, {3}, 3});
  StateDictStreamDigest stream(layout);
  const std::string bytes = "01234567xyz";
  EXPECT_THAT(stream.StateSha256().status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("b")));
  // Chunks that straddle the boundaries.
  stream.Update(bytes.substr(0, 5));
  stream.Update(bytes.substr(5, 4));
  EXPECT_FALSE(stream.complete());
  stream.Update(bytes.substr(9));
  stream.Update("ignored: past the layout");
  ASSERT_TRUE(stream.complete());
  auto entries = stream.Entries();
  ASSERT_THAT(entries.status(), IsOk());
  ASSERT_EQ(entries->size(), 3u);
  EXPECT_EQ((*entries)[0].sha256, Sha256Hex("01234567"));
  EXPECT_EQ((*entries)[1].sha256, Sha256Hex(""));
  EXPECT_EQ((*entries)[2].sha256, Sha256Hex("xyz"));
  // Key order: a, b, empty.
  auto digest = stream.StateSha256();
  ASSERT_THAT(digest.status(), IsOk());
  EXPECT_EQ(*digest, Sha256Hex(absl::HexStringToBytes(Sha256Hex("xyz")) +
                               absl::HexStringToBytes(Sha256Hex("01234567")) +
                               absl::HexStringToBytes(Sha256Hex(""))));
}

// Each load's record holds the SHA-256 of what the client sent, and the
// attestation lists the load as a resolved dependency with that digest.
TEST_F(AttestServerTest, LoadRecordsAndAttestationCarryTheLoadedDigest) {
  ASSERT_THAT(client_
                  ->BuildModule(BuildRequest("team/lin", R"({"type": "Linear",
                                                         "args": [3, 2]})"))
                  .status(),
              IsOk());
  StateDict sent;
  sent.tensors.Set("weight", *Tensor::Full(DType::kFloat32, {2, 3}, 0.5));
  sent.tensors.Set("bias", *Tensor::Full(DType::kFloat32, {2}, -1.0));
  auto sent_entries = StateDictSubjects(sent, 1);
  ASSERT_THAT(sent_entries.status(), IsOk());
  auto expected = StateSha256(*sent_entries);
  ASSERT_THAT(expected.status(), IsOk());
  client::LoadStateDictOptions copy;
  copy.chunk_bytes = 5;  // chunks across the entries' boundaries
  ASSERT_THAT(client_->LoadStateDict("team/lin", sent, copy).status(), IsOk());
  client::LoadStateDictOptions assign;
  assign.load.assign = true;
  ASSERT_THAT(client_->LoadStateDict("team/lin", sent, assign).status(),
              IsOk());

  v1::QueryAuditRequest query;
  query.mutable_filter()->set_module("lin");
  query.mutable_filter()->set_type("load_state_dict");
  auto records = client_->QueryAudit(query);
  ASSERT_THAT(records.status(), IsOk());
  ASSERT_EQ(records->records_size(), 2);
  for (const auto& record : records->records()) {
    EXPECT_EQ(nlohmann::json::parse(record.details_json())["sha256"], *expected)
        << record.details_json();
  }
  // The module now holds exactly what was loaded: its subjects give the
  // same digest.
  auto attested = client_->AttestModule("team/lin");
  ASSERT_THAT(attested.status(), IsOk());
  auto statement =
      InTotoStatementFromJson(DsseFromJson(attested->envelope())->payload);
  ASSERT_THAT(statement.status(), IsOk());
  EXPECT_EQ(*StateSha256(statement->subjects), *expected);
  const auto loads = nlohmann::json::parse(
      statement->predicate_json)["buildDefinition"]["resolvedDependencies"];
  ASSERT_EQ(loads.size(), 2u);
  for (const auto& load : loads) {
    EXPECT_EQ(load["digest"]["sha256"], *expected) << load.dump();
  }
}

// get-state --sign: the server hashes the file the CLI writes without
// seeing it (with filters and a dtype conversion too), the bundle verifies
// with verify-bundle, and a changed file or a wrong key fails.
TEST_F(AttestServerTest, GetStateSignWritesABundleForTheFile) {
  ASSERT_THAT(client_
                  ->BuildModule(BuildRequest(
                      "team/mlp", R"({"type": "Sequential", "children": [
        {"spec": {"type": "Linear", "args": [4, 3]}},
        {"spec": {"type": "BatchNorm1d", "args": [3]}}]})"))
                  .status(),
              IsOk());
  const std::string key = client_->AttestModule("team/mlp")->verifier_key();
  const std::vector<std::vector<std::string>> variants = {
      {}, {"--dtype", "float16"}, {"--prefix", "1."}, {"--glob", "*.weight"}};
  for (const auto& extra : variants) {
    const std::string file = Path("mlp.safetensors");
    std::vector<std::string> args = {"get-state", "team/mlp", "-o", file,
                                     "--sign"};
    args.insert(args.end(), extra.begin(), extra.end());
    CliResult r = Cli(args);
    ASSERT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("signed " + file + " (SHA-256 " +
                                 Sha256Hex(*ReadFile(file)) + ")"));
    auto bundle = ReadFile(file + ".sig");
    ASSERT_THAT(bundle.status(), IsOk());
    auto files = VerifyOmsBundle(*bundle, ParseVerifierKey(key)->public_key);
    ASSERT_THAT(files.status(), IsOk());
    ASSERT_EQ(files->size(), 1u);
    EXPECT_EQ((*files)[0].name, "mlp.safetensors");
    EXPECT_EQ((*files)[0].sha256, Sha256Hex(*ReadFile(file)));
    r = Cli({"verify-bundle", file + ".sig", "--key", key, "--file", file});
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("OK"));
  }

  // A changed file, a renamed one, another key.
  const std::string file = Path("mlp.safetensors");
  const std::string sig = file + ".sig";
  std::string bytes = *ReadFile(file);
  bytes.back() ^= 1;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  CliResult r = Cli({"verify-bundle", sig, "--key", key, "--file", file});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("FAILED: file 'mlp.safetensors': digest"));
  const std::string renamed = Path("other.safetensors");
  std::filesystem::copy_file(file, renamed);
  r = Cli({"verify-bundle", sig, "--key", key, "--file", renamed});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("not among the bundle's resources"));
  auto other = Ed25519PrivateKey::FromSeed(std::string(32, '\x09'));
  auto other_key =
      MakeVerifierKey("other", kNoteSignatureEd25519, other->public_key());
  ASSERT_THAT(other_key.status(), IsOk());
  r = Cli({"verify-bundle", sig, "--key", FormatVerifierKey(*other_key),
           "--file", file});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.out, HasSubstr("FAILED: bundle"));

  // Bad requests name what is wrong.
  EXPECT_THAT(
      client_->SignStateFile("team/mlp", {}, "a/b").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("file_name")));
  EXPECT_THAT(client_->SignStateFile("team/none", {}, "x").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("team/none")));
}

// A module deleted and built again from the same spec and seed holds the
// same bytes, and the old attestation's records stay in the log, where
// they verify. The attestation names the build record that began its
// life; --online with --module finds the later delete in the log and says
// that the live module is another one of that name.
TEST_F(AttestServerTest, OnlineVerifyTellsALaterModuleOfTheSameName) {
  const std::string spec = R"({"type": "Linear", "args": [4, 3]})";
  ASSERT_THAT(client_->BuildModule(BuildRequest("team/re", spec, 7)).status(),
              IsOk());
  auto attested = client_->AttestModule("team/re");
  ASSERT_THAT(attested.status(), IsOk());
  const std::string key = attested->verifier_key();
  const std::string old_dsse = Path("re-old.dsse.json");
  std::ofstream(old_dsse) << attested->envelope();
  auto statement =
      InTotoStatementFromJson(DsseFromJson(attested->envelope())->payload);
  ASSERT_THAT(statement.status(), IsOk());
  const uint64_t build_seq = nlohmann::json::parse(
      statement->predicate_json)["buildDefinition"]["externalParameters"]
                                ["build"]["seq"];

  CliResult r = Cli({"verify-attestation", old_dsse, "--key", key, "--module",
                     "team/re", "--online"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat(
                         "module: team/re is the attested one (its life began "
                         "at audit record ",
                         build_seq, ")")));

  ASSERT_THAT(client_->DeleteModule("team/re"), IsOk());
  ASSERT_THAT(client_->BuildModule(BuildRequest("team/re", spec, 7)).status(),
              IsOk());
  r = Cli({"verify-attestation", old_dsse, "--key", key, "--module", "team/re",
           "--online"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("digests: 2 entries match module team/re"));
  EXPECT_THAT(r.out, HasSubstr("included in the checkpoint"));
  EXPECT_THAT(r.out,
              HasSubstr(absl::StrCat(
                  "FAILED: module: team/re was deleted (audit record ")));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat(
                         ") after the attested life began (record ", build_seq,
                         "): the live module is a later one of that name")));

  // Offline, the bytes match and nothing tells: the output says what was
  // not checked.
  r = Cli(
      {"verify-attestation", old_dsse, "--key", key, "--module", "team/re"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("module: not checked for a later module of "
                               "the same name (--online checks it)"));
  // Without --module the statement is about the past, which stays true.
  r = Cli({"verify-attestation", old_dsse, "--key", key, "--online"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;

  // The new module's own attestation verifies.
  auto fresh = client_->AttestModule("team/re");
  ASSERT_THAT(fresh.status(), IsOk());
  const std::string new_dsse = Path("re-new.dsse.json");
  std::ofstream(new_dsse) << fresh->envelope();
  r = Cli({"verify-attestation", new_dsse, "--key", key, "--module", "team/re",
           "--online"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;

  // A module that came by a cluster move cites no build: its life begins
  // at its first cited record, and the later delete is found all the same.
  auto signing_key = Ed25519PrivateKey::FromPem(
      *ReadFile((server_.data_dir() / "audit.key").string()));
  ASSERT_THAT(signing_key.status(), IsOk());
  nlohmann::json predicate = nlohmann::json::parse(statement->predicate_json);
  predicate["buildDefinition"]["externalParameters"].erase("build");
  statement->predicate_json = predicate.dump();
  auto unbuilt = SignDsse(kInTotoPayloadType,
                          *InTotoStatementToJson(*statement), *signing_key);
  ASSERT_THAT(unbuilt.status(), IsOk());
  const std::string moved_dsse = Path("re-moved.dsse.json");
  std::ofstream(moved_dsse) << DsseToJson(*unbuilt);
  r = Cli({"verify-attestation", moved_dsse, "--key", key, "--module",
           "team/re", "--online"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("FAILED: module: team/re was deleted"));
}

// A statement signed with the log's own key yet malformed (a server bug,
// a stolen key): each is a FAILED line naming the field, never a crash
// (nlohmann throws on a wrong type, and its const operator[] on a missing
// key is undefined) nor an OK that checked nothing.
TEST_F(AttestServerTest, VerifyRejectsMalformedSignedPredicates) {
  ASSERT_THAT(client_
                  ->BuildModule(BuildRequest(
                      "team/mal", R"({"type": "Linear", "args": [3, 2]})"))
                  .status(),
              IsOk());
  auto attested = client_->AttestModule("team/mal");
  ASSERT_THAT(attested.status(), IsOk());
  const std::string key = attested->verifier_key();
  auto signing_key = Ed25519PrivateKey::FromPem(
      *ReadFile((server_.data_dir() / "audit.key").string()));
  ASSERT_THAT(signing_key.status(), IsOk());
  const nlohmann::json original =
      nlohmann::json::parse(DsseFromJson(attested->envelope())->payload);
  const std::string bp = "/predicate/runDetails/byproducts";
  const std::string records = bp + "/1/annotations/records";
  using Json = nlohmann::json;
  using Pointer = Json::json_pointer;
  struct Case {
    std::string what;
    std::function<void(Json&)> change;
    std::string failed;  // the FAILED line's start
  };
  auto set = [](std::string at, Json value) {
    return [at, value](Json& s) { s[Pointer(at)] = value; };
  };
  auto erase = [](std::string at) {
    return [at](Json& s) {
      Pointer p(at);
      const std::string last = p.back();
      p.pop_back();
      Json& parent = s[p];
      if (parent.is_array()) {
        parent.erase(std::stoul(last));
      } else {
        parent.erase(last);
      }
    };
  };
  const std::vector<Case> cases = {
      {"_type a number", set("/_type", 5), "FAILED: statement: "},
      {"runDetails not an object", set("/predicate/runDetails", Json::array()),
       "FAILED: predicate: runDetails.byproducts is missing or not an array"},
      {"byproduct a number", set(bp + "/0", 7),
       "FAILED: predicate: runDetails.byproducts[0] is not an object"},
      {"checkpoint's name a number", set(bp + "/0/name", 3),
       "FAILED: predicate: runDetails.byproducts has no audit-checkpoint"},
      {"checkpoint's content a number", set(bp + "/0/content", 3),
       "FAILED: predicate: runDetails.byproducts[0] has no content (text)"},
      {"checkpoint's content not base64", set(bp + "/0/content", "@@"),
       "FAILED: predicate: runDetails.byproducts[0].content is not a base64"},
      {"records without annotations", erase(bp + "/1/annotations"),
       "FAILED: predicate: runDetails.byproducts[1].annotations.records is "
       "missing or not an array"},
      {"records an object", set(records, Json{{"a", 1}}),
       "FAILED: predicate: runDetails.byproducts[1].annotations.records is "
       "missing or not an array"},
      {"a record text", set(records + "/0", "x"),
       "FAILED: predicate: runDetails.byproducts[1].annotations.records[0] is "
       "not an object"},
      {"seq text", set(records + "/0/seq", "1"),
       "FAILED: predicate: runDetails.byproducts[1].annotations.records[0].seq "
       "is not an audit record seq"},
      {"seq missing", erase(records + "/0/seq"),
       "FAILED: predicate: runDetails.byproducts[1].annotations.records[0].seq "
       "is not an audit record seq"},
      {"seq negative", set(records + "/0/seq", -1),
       "FAILED: predicate: runDetails.byproducts[1].annotations.records[0].seq "
       "is not an audit record seq"},
      {"seq 0", set(records + "/0/seq", 0),
       "FAILED: predicate: runDetails.byproducts[1].annotations.records[0].seq "
       "is not an audit record seq"},
      {"leaf hash a number", set(records + "/0/leaf_hash", 1),
       "FAILED: predicate: runDetails.byproducts[1].annotations.records[0]."
       "leaf_hash is not a SHA-256 in lowercase hex"},
      {"no records", set(records, Json::array()),
       "FAILED: predicate: runDetails.byproducts cite no audit records"},
      {"no records byproduct", erase(bp + "/1"),
       "FAILED: predicate: runDetails.byproducts cite no audit records"},
      {"a record twice",
       [&](Json& s) {
         Json& list = s[Pointer(records)];
         list.push_back(list[0]);
       },
       "FAILED: predicate: runDetails.byproducts[1].annotations.records["},
      {"two checkpoints",
       [&](Json& s) {
         Json& list = s[Pointer(bp)];
         list.push_back(list[0]);
       },
       "FAILED: predicate: runDetails.byproducts[3] repeats audit-checkpoint"},
      {"build seq text",
       set("/predicate/buildDefinition/externalParameters/build/seq", "x"),
       "FAILED: predicate: buildDefinition.externalParameters.build.seq is "
       "not an audit record seq"},
      {"build seq not cited",
       set("/predicate/buildDefinition/externalParameters/build/seq", 99999),
       "FAILED: predicate: buildDefinition.externalParameters.build.seq 99999 "
       "is not among the cited records"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Json statement = original;
    c.change(statement);
    auto signed_envelope =
        SignDsse(kInTotoPayloadType, statement.dump(), *signing_key);
    ASSERT_THAT(signed_envelope.status(), IsOk());
    const std::string file = Path("malformed.dsse.json");
    std::ofstream(file, std::ios::trunc) << DsseToJson(*signed_envelope);
    CliResult r = Cli({"verify-attestation", file, "--key", key, "--module",
                       "team/mal", "--online"});
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr(c.failed)) << r.out << r.err;
    EXPECT_THAT(r.out, ::testing::Not(HasSubstr("\nOK\n")));
  }
}

// A delete and a rebuild that the log missed (the server stopped after
// saving each and before recording it) come back at the next starts as
// "recovered" records naming the change: the module check reads them as
// it reads recorded ones, and a new attestation's life begins there.
TEST_F(AttestServerTest, OnlineVerifyTellsARebuildRecoveredAtStart) {
  const std::string spec = R"({"type": "Linear", "args": [4, 3]})";
  ASSERT_THAT(client_->BuildModule(BuildRequest("team/rc", spec, 7)).status(),
              IsOk());
  auto attested = client_->AttestModule("team/rc");
  ASSERT_THAT(attested.status(), IsOk());
  const std::string key = attested->verifier_key();
  const std::string old_dsse = Path("rc-old.dsse.json");
  std::ofstream(old_dsse) << attested->envelope();
  const std::filesystem::path log = server_.data_dir() / "audit.log";
  auto log_lines = [&] {
    std::ifstream in(log);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  };

  // A delete that committed its tombstone (ModuleRepository::Remove, the
  // delete's first half) when the server died, before the delete's record.
  client_.reset();
  server_.Stop();
  {
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<ModuleRepository> repo,
        ModuleRepository::Open((server_.data_dir() / "modules").string()));
    ASSERT_THAT(repo->LoadAll().modules, ::testing::SizeIs(1));
    MODELSTATE_ASSERT_OK_AND_ASSIGN(ModuleName name,
                                    ParseModuleName("team/rc"));
    ChangeNote note;
    note.type = "delete";
    note.correlation_id = "crashed-delete";
    note.audit_seq = log_lines().size();
    ASSERT_THAT(repo->Remove(name, note), IsOk());
  }
  ASSERT_THAT(server_.Start(), IsOk());
  client_ = server_.NewClient();
  EXPECT_THAT(client_->GetStateDict("team/rc").status(),
              StatusIs(absl::StatusCode::kNotFound));

  // A rebuild whose record the log lost: the log ends before it, as in
  // tests/server/durability_test.cc, and no checkpoint covers what is gone.
  ASSERT_THAT(client_->BuildModule(BuildRequest("team/rc", spec, 7)).status(),
              IsOk());
  client_.reset();
  server_.Stop();
  std::vector<std::string> lines = log_lines();
  while (!lines.empty() &&
         lines.back().find(R"("type":"build")") == std::string::npos) {
    lines.pop_back();
  }
  ASSERT_FALSE(lines.empty());
  lines.pop_back();
  {
    std::ofstream out(log, std::ios::trunc);
    for (const std::string& line : lines) out << line << "\n";
  }
  std::filesystem::remove(server_.data_dir() / "audit.checkpoint");
  ASSERT_THAT(server_.Start(), IsOk());
  client_ = server_.NewClient();

  CliResult r = Cli({"audit", "query", "--type", "recovered"});
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_THAT(r.out, HasSubstr(R"("change":"delete")"));
  ASSERT_THAT(r.out, HasSubstr(R"("change":"build")"));
  r = Cli({"verify-attestation", old_dsse, "--key", key, "--module", "team/rc",
           "--online"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("digests: 2 entries match module team/rc"));
  EXPECT_THAT(r.out, HasSubstr("included in the checkpoint"));
  EXPECT_THAT(r.out, HasSubstr("FAILED: module: team/rc was deleted "
                               "(audit record "));
  EXPECT_THAT(r.out, HasSubstr(", recovered at a start: the server had "
                               "stopped before recording it) after the "
                               "attested life began"));

  // The live module's own attestation cites the recovered build as the
  // start of its life, not the first build, and verifies.
  auto fresh = client_->AttestModule("team/rc");
  ASSERT_THAT(fresh.status(), IsOk());
  auto statement =
      InTotoStatementFromJson(DsseFromJson(fresh->envelope())->payload);
  ASSERT_THAT(statement.status(), IsOk());
  const auto predicate = nlohmann::json::parse(statement->predicate_json);
  EXPECT_FALSE(
      predicate["buildDefinition"]["externalParameters"].contains("build"))
      << statement->predicate_json;
  const auto& cited =
      predicate["runDetails"]["byproducts"][1]["annotations"]["records"];
  ASSERT_EQ(cited.size(), 1u) << cited.dump();
  EXPECT_EQ(cited[0]["type"], "recovered");
  const std::string new_dsse = Path("rc-new.dsse.json");
  std::ofstream(new_dsse) << fresh->envelope();
  r = Cli({"verify-attestation", new_dsse, "--key", key, "--module", "team/rc",
           "--online"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

// Exit status 1 says the attestation does not hold; 3 that it could not be
// checked: the server unreachable, a permission missing, a file that
// cannot be read, more records than --max-records. Never 0 for those.
TEST_F(AttestServerTest, CouldNotCheckHasItsOwnExitStatus) {
  ASSERT_THAT(client_
                  ->BuildModule(BuildRequest(
                      "team/ex", R"({"type": "Linear", "args": [3, 2]})"))
                  .status(),
              IsOk());
  auto attested = client_->AttestModule("team/ex");
  ASSERT_THAT(attested.status(), IsOk());
  const std::string key = attested->verifier_key();
  const std::string dsse = Path("ex.dsse.json");
  std::ofstream(dsse) << attested->envelope();
  CliResult r = Cli({"verify-attestation", dsse, "--key", key, "--module",
                     "team/ex", "--online"});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const size_t cited =
      nlohmann::json::parse(
          DsseFromJson(attested->envelope())
              ->payload)["predicate"]["runDetails"]["byproducts"][1]
                        ["annotations"]["records"]
                            .size();

  // No server at that address.
  std::vector<std::string> args = {
      "--server", "127.0.0.1:1", "--timeout", "2",       "verify-attestation",
      dsse,       "--key",       key,         "--online"};
  std::ostringstream out, err;
  cli::Environment env;
  env.out = &out;
  env.err = &err;
  EXPECT_EQ(cli::RunCli(args, env), cli::kExitNotChecked)
      << out.str() << err.str();
  EXPECT_THAT(out.str(), HasSubstr("NOT CHECKED: record "));
  EXPECT_THAT(out.str(), HasSubstr("UNAVAILABLE"));
  EXPECT_THAT(out.str(), ::testing::Not(HasSubstr("FAILED")));

  // Files that cannot be read.
  r = Cli({"verify-attestation", Path("none.dsse.json"), "--key", key});
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  r = Cli({"verify-attestation", dsse, "--key", key, "--file",
           Path("none.safetensors")});
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("signature: OK"));
  r = Cli({"verify-bundle", Path("none.sig"), "--key", key, "--file", dsse});
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  // A module that is not there is an answer: not the attested one.
  ASSERT_THAT(client_->DeleteModule("team/ex"), IsOk());
  r = Cli({"verify-attestation", dsse, "--key", key, "--module", "team/ex"});
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("FAILED: module: "));
  // A usage error stays 2.
  r = Cli({"verify-attestation", dsse, "--key", key, "--max-records", "many"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  // Not wrapped round to a huge limit, which would mean "no limit".
  r = Cli({"verify-attestation", dsse, "--key", key, "--max-records", "-1"});
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("--max-records"));

  // More cited records than --max-records: refused before any call.
  r = Cli({"verify-attestation", dsse, "--key", key, "--online",
           "--max-records", absl::StrCat(cited - 1)});
  EXPECT_EQ(r.code, 3) << r.out << r.err;
  EXPECT_THAT(r.out,
              HasSubstr(absl::StrCat("NOT CHECKED: records: RESOURCE_EXHAUSTED:"
                                     " the statement cites ",
                                     cited,
                                     " audit records, more than "
                                     "--max-records ",
                                     cited - 1)));
  r = Cli({"verify-attestation", dsse, "--key", key, "--online",
           "--max-records", absl::StrCat(cited)});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  r = Cli({"verify-attestation", dsse, "--key", key, "--online",
           "--max-records", "0"});
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

// An auditor is needed for --online: a reader of the namespace (who may
// compare the live module) gets "not checked", not "does not hold".
TEST(AttestPermissionTest, AMissingPermissionIsNotCheckedNotFailed) {
  const std::filesystem::path tokens =
      std::filesystem::temp_directory_path() /
      absl::StrCat("attest-perm-tokens-", getpid(), ".json");
  InProcessServer server([&tokens](server::ServerConfig& config) {
    config.token_file = tokens.string();
  });
  {
    nlohmann::json principals = nlohmann::json::array();
    principals.push_back({{"identity", "root"},
                          {"token_sha256", Sha256Hex("root-token")},
                          {"roles", {{"admin", {"*"}}}}});
    principals.push_back({{"identity", "rita"},
                          {"token_sha256", Sha256Hex("rita-token")},
                          {"roles", {{"reader", {"team"}}}}});
    std::ofstream(tokens) << nlohmann::json{{"principals", principals}}.dump();
    std::filesystem::permissions(tokens,
                                 std::filesystem::perms::owner_read |
                                     std::filesystem::perms::owner_write |
                                     std::filesystem::perms::group_read |
                                     std::filesystem::perms::others_read);
  }
  ASSERT_THAT(server.Start(), IsOk());
  client::ClientOptions root;
  root.bearer_token = "root-token";
  auto client = server.NewClient(root);
  ASSERT_THAT(client
                  ->BuildModule(BuildRequest(
                      "team/p", R"({"type": "Linear", "args": [3, 2]})"))
                  .status(),
              IsOk());
  auto attested = client->AttestModule("team/p");
  ASSERT_THAT(attested.status(), IsOk());
  const std::string dsse = (server.dir() / "p.dsse.json").string();
  std::ofstream(dsse) << attested->envelope();
  const std::filesystem::path rita = server.dir() / "rita.token";
  std::ofstream(rita) << "rita-token";
  std::ostringstream out, err;
  cli::Environment env;
  env.out = &out;
  env.err = &err;
  const int code =
      cli::RunCli({"--server", server.address(), "--token-file", rita.string(),
                   "verify-attestation", dsse, "--key",
                   attested->verifier_key(), "--module", "team/p", "--online"},
                  env);
  EXPECT_EQ(code, cli::kExitNotChecked) << out.str() << err.str();
  EXPECT_THAT(out.str(), HasSubstr("digests: 2 entries match module team/p"));
  EXPECT_THAT(out.str(), HasSubstr("NOT CHECKED: record "));
  EXPECT_THAT(out.str(), HasSubstr("PERMISSION_DENIED"));
  server.Stop();
  std::filesystem::remove(tokens);
}

}  // namespace
}  // namespace modelstate

// ModelStore on its own: builds, registrations, snapshots, loads (in memory
// and staged), moves, deletions, quotas, listings, concurrent readers and
// writers, and a decider that holds a change while readers go on.
#include "service/model_store.h"

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "core/forward_hooks.h"
#include "core/staged_state_dict.h"
#include "core/state_stream.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "service/audit_log.h"
#include "service/data_dir.h"
#include "service/model_service.h"
#include "service/module_repository.h"
#include "service/module_transfer.h"
#include "tests/testing/spec_json.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace modelstate {
namespace {

namespace fs = std::filesystem;
using ::modelstate::testing::ExpectSameState;
using ::modelstate::testing::Filled;
using ::modelstate::testing::HostBytes;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::SpecFromJson;
using ::modelstate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr char kLinear[] = R"({"type": "Linear", "args": [4, 3]})";

ModuleName Name(const std::string& text) { return *ParseModuleName(text); }

// Every tensor of `state` holds `value` in every element (float32).
bool AllEqual(const StateDict& state, float value) {
  for (const auto& item : state.tensors) {
    const float* data = item.value.data<float>();
    for (int64_t i = 0; i < item.value.numel(); ++i) {
      if (data[i] != value) return false;
    }
  }
  return true;
}

// A Linear(4, 3) state_dict whose every element is `value`.
StateDict Pattern(float value) {
  StateDict state;
  state.tensors.Set("weight", Filled(DType::kFloat32, {3, 4}, value));
  state.tensors.Set("bias", Filled(DType::kFloat32, {3}, value));
  return state;
}

class ModelStoreTest : public ::testing::Test {
 protected:
  ModelStoreTest() {
    dir_ = fs::temp_directory_path() /
           absl::StrCat(
               "model-store-test-", getpid(), "-",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~ModelStoreTest() override {
    store_.reset();
    repository_.reset();
    audit_.reset();
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  // An audit log and a repository in the test's directory.
  void MakeDurable() {
    audit_ = *AuditLog::Open((dir_ / "audit.log").string());
    repository_ = *ModuleRepository::Open((dir_ / "modules").string());
    store_->set_audit_log(audit_.get());
    store_->set_repository(repository_.get());
  }

  // A new store and repository on the same directory and audit log, as
  // after a restart.
  ModelStore::RestoreReport Restart() {
    store_ = std::make_unique<ModelStore>();
    repository_ = *ModuleRepository::Open((dir_ / "modules").string());
    store_->set_audit_log(audit_.get());
    store_->set_repository(repository_.get());
    return store_->Restore();
  }

  absl::StatusOr<BuildOutcome> Build(const std::string& name,
                                     const std::string& json = kLinear) {
    BuildOptions options;
    options.hooks = nullptr;
    return store_->Build(ctx_, Name(name), SpecFromJson(json), options, false);
  }

  // Until `count` builds wait for another build of `name` (false after
  // 30 s): a test that needs a waiter does not guess how long one takes.
  bool AwaitWaiters(const ModuleName& name, int count) {
    const absl::Time until = absl::Now() + absl::Seconds(30);
    while (store_->BuildsWaiting(name) != count) {
      if (absl::Now() > until) return false;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return true;
  }

  StateDict State(const std::string& name) {
    absl::StatusOr<StateDictSnapshot> snapshot =
        store_->Snapshot(Name(name), {});
    EXPECT_THAT(snapshot.status(), IsOk());
    return snapshot.ok() ? snapshot->state : StateDict();
  }

  // A cluster move of `name` whose sender fails before the target hears
  // of it.
  absl::Status MoveOutCutOff(
      const std::string& name,
      const std::function<bool(const absl::Status&)>& still_owner = {}) {
    return store_->MoveOut(
        ctx_, Name(name), "there",
        [](const std::vector<std::string>&) -> absl::StatusOr<uint64_t> {
          return absl::UnavailableError("cut off");
        },
        still_owner);
  }

  std::string Manifest(const std::string& name) {
    return data_dir::ManifestPath(
        data_dir::ModuleDir((dir_ / "modules").string(), Name(name)));
  }

  std::vector<AuditRecord> Records(const std::string& type) {
    AuditQuery query;
    query.type = type;
    query.limit = AuditQuery::kMaxLimit;
    return *audit_->Query(query);
  }

  // Streams `state` into a staged load of `name`: StageLoad, the bytes in
  // small pieces, then LoadStaged.
  absl::StatusOr<LoadResult> StagedLoad(const std::string& name,
                                        const StateDict& state,
                                        const LoadOptions& options) {
    MODELSTATE_ASSIGN_OR_RETURN(auto reader,
                                StateDictReader::Create(state, std::nullopt));
    MODELSTATE_ASSIGN_OR_RETURN(
        std::unique_ptr<StagedStateDict> staged,
        store_->StageLoad(ctx_, Name(name), reader->layout(), StreamLimits{},
                          options, dir_.string()));
    while (reader->remaining() > 0) {
      std::string bytes;
      MODELSTATE_ASSIGN_OR_RETURN(size_t n, reader->Read(7, &bytes));
      if (n == 0) break;
      MODELSTATE_RETURN_IF_ERROR(staged->Append(std::move(bytes)));
    }
    return store_->LoadStaged(ctx_, Name(name), *staged, options);
  }

  fs::path dir_;
  OperationContext ctx_{"alice", "req-1"};
  std::unique_ptr<AuditLog> audit_;
  std::unique_ptr<ModuleRepository> repository_;
  std::unique_ptr<ModelStore> store_ = std::make_unique<ModelStore>();
};

TEST_F(ModelStoreTest, BuildStoresTheModuleOnceAndRecordsIt) {
  MakeDurable();
  MODELSTATE_ASSERT_OK_AND_ASSIGN(BuildOutcome built, Build("team/lin"));
  EXPECT_EQ(built.registrations.size(), 2u);  // weight, bias
  EXPECT_EQ(store_->size(), 1u);
  EXPECT_EQ(State("team/lin").tensors.Keys(),
            (std::vector<std::string>{"weight", "bias"}));
  EXPECT_THAT(Build("team/lin").status(),
              StatusIs(absl::StatusCode::kAlreadyExists,
                       HasSubstr("'team/lin' already exists")));
  std::vector<AuditRecord> builds = Records("build");
  ASSERT_EQ(builds.size(), 1u);
  EXPECT_EQ(builds[0].identity, "alice");
  EXPECT_EQ(builds[0].correlation_id, "req-1");
  EXPECT_EQ(builds[0].ns, "team");
  EXPECT_EQ(builds[0].module, "lin");
  EXPECT_EQ(builds[0].outcome, "ok");
  nlohmann::json details = nlohmann::json::parse(builds[0].details_json);
  EXPECT_EQ(details["type"], "Linear");
  EXPECT_EQ(details["registrations"], 2);
  // Saved: its manifest is committed.
  EXPECT_TRUE(fs::exists(Manifest("team/lin")));
}

TEST_F(ModelStoreTest, RegisterAddsAndRemovesEntriesAndNamesWhatIsMissing) {
  ASSERT_THAT(Build("t/m").status(), IsOk());
  RegistrationRequest add;
  add.name = "running";
  add.kind = EntryKind::kBuffer;
  add.value.tensor = Filled(DType::kFloat32, {2}, 5);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::vector<RegistrationResult> results,
                                  store_->Register(ctx_, Name("t/m"), add));
  ASSERT_EQ(results.size(), 1u);
  EXPECT_FALSE(results[0].final.blocked());
  EXPECT_EQ(State("t/m").tensors.Keys(),
            (std::vector<std::string>{"weight", "bias", "running"}));

  RegistrationRequest remove;
  remove.name = "running";
  remove.removal = true;
  ASSERT_THAT(store_->Register(ctx_, Name("t/m"), remove).status(), IsOk());
  EXPECT_EQ(State("t/m").tensors.Keys(),
            (std::vector<std::string>{"weight", "bias"}));

  add.path = "nowhere";
  EXPECT_THAT(store_->Register(ctx_, Name("t/m"), add).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("path 'nowhere' in 't/m'")));
  EXPECT_THAT(store_->Register(ctx_, Name("t/none"), remove).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("'t/none' does not exist")));
}

TEST_F(ModelStoreTest, SharingASubmoduleCountsItsEntriesOncePerPath) {
  // A chain n0.a.a...a (6 levels) with a Linear at the bottom; sharing each
  // level's "a" again as "b", bottom up, doubles the state_dict each time.
  std::string json = R"({"type": "Linear", "args": [1, 1]})";
  for (int i = 0; i < 6; ++i) {
    json = absl::StrCat(R"({"type": "N", "members": [{"module": {"name": "a",
        "spec": )",
                        json, "}}]}");
  }
  ASSERT_THAT(Build("t/chain", json).status(), IsOk());
  RegistrationRequest share;
  share.kind = EntryKind::kModule;
  share.name = "b";
  share.build_options.limits.max_entries = 100;
  std::string path = "a.a.a.a.a";
  size_t keys = 2;
  for (int level = 5; level >= 0; --level) {
    share.path = path;
    share.existing_path = path.empty() ? "a" : path + ".a";
    absl::StatusOr<std::vector<RegistrationResult>> shared =
        store_->Register(ctx_, Name("t/chain"), share);
    if (keys * 2 > 32) {
      // 64 keys and as many submodule paths: over 100.
      EXPECT_THAT(shared.status(),
                  StatusIs(absl::StatusCode::kResourceExhausted,
                           HasSubstr("max_entries limit of 100")));
      EXPECT_EQ(State("t/chain").tensors.size(), keys);  // unchanged
      break;
    }
    ASSERT_THAT(shared.status(), IsOk());
    keys *= 2;
    EXPECT_EQ(State("t/chain").tensors.size(), keys);
    path = path.size() > 1 ? path.substr(0, path.size() - 2) : "";
  }
  EXPECT_EQ(keys, 32u);
  // 32 keys and 32 submodule paths now. A tensor registered in the module
  // shared along 8 paths adds 8 keys.
  RegistrationRequest add;
  add.kind = EntryKind::kBuffer;
  add.name = "count";
  add.path = "a.a.a.a.a";
  add.value.tensor = Filled(DType::kFloat32, {1}, 1);
  add.build_options.limits.max_entries = 71;
  EXPECT_THAT(store_->Register(ctx_, Name("t/chain"), add).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("would have 72 state_dict keys")));
  add.build_options.limits.max_entries = 72;
  EXPECT_THAT(store_->Register(ctx_, Name("t/chain"), add).status(), IsOk());
  EXPECT_EQ(State("t/chain").tensors.size(), 40u);
}

TEST_F(ModelStoreTest, SnapshotsFilterAndDoNotChangeWithLaterWrites) {
  ASSERT_THAT(Build("t/m").status(), IsOk());
  ASSERT_THAT(store_->Load(ctx_, Name("t/m"), Pattern(1), {}).status(), IsOk());
  SnapshotFilter filter;
  filter.key_glob = "b*";
  MODELSTATE_ASSERT_OK_AND_ASSIGN(StateDictSnapshot only_bias,
                                  store_->Snapshot(Name("t/m"), filter));
  EXPECT_EQ(only_bias.state.tensors.Keys(), std::vector<std::string>{"bias"});
  EXPECT_THAT(only_bias.kinds, ElementsAre(EntryKind::kParameter));

  StateDict before = State("t/m");
  ASSERT_THAT(store_->Load(ctx_, Name("t/m"), Pattern(2), {}).status(), IsOk());
  EXPECT_TRUE(AllEqual(before, 1));  // the snapshot kept its values
  EXPECT_TRUE(AllEqual(State("t/m"), 2));
}

TEST_F(ModelStoreTest,
       StagedLoadsApplyOnlyWhenWholeAndFailEarlyWhenTheyCannot) {
  MakeDurable();
  ASSERT_THAT(Build("t/m").status(), IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(LoadResult loaded,
                                  StagedLoad("t/m", Pattern(3), {}));
  EXPECT_TRUE(loaded.keys.missing_keys.empty());
  EXPECT_TRUE(AllEqual(State("t/m"), 3));

  // An atomic load whose layout does not fit fails before any byte.
  StateDict wrong = Pattern(4);
  wrong.tensors.Set("extra", Filled(DType::kFloat32, {1}, 4));
  MODELSTATE_ASSERT_OK_AND_ASSIGN(auto reader,
                                  StateDictReader::Create(wrong, std::nullopt));
  EXPECT_THAT(
      store_
          ->StageLoad(ctx_, Name("t/m"), reader->layout(), StreamLimits{},
                      LoadOptions{}, dir_.string())
          .status(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("Unexpected key(s) in state_dict: \"extra\"")));
  // A staged load missing bytes changes nothing.
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<StagedStateDict> partial,
      store_->StageLoad(ctx_, Name("t/m"), reader->layout(), StreamLimits{},
                        LoadOptions{.strict = false}, dir_.string()));
  EXPECT_THAT(store_
                  ->LoadStaged(ctx_, Name("t/m"), *partial,
                               LoadOptions{.strict = false})
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(AllEqual(State("t/m"), 3));
  // The truncated load is recorded like the one that failed early.
  std::vector<AuditRecord> loads = Records("load_state_dict");
  ASSERT_EQ(loads.size(), 3u);
  EXPECT_EQ(loads[0].outcome, "ok");
  EXPECT_EQ(loads[1].outcome, "error");
  EXPECT_EQ(loads[2].outcome, "error");
}

TEST_F(ModelStoreTest, MoveConvertsFloatingTensorsAndDeleteRemoves) {
  MakeDurable();
  ASSERT_THAT(Build("t/m").status(), IsOk());
  ASSERT_THAT(store_->Move(ctx_, Name("t/m"), std::nullopt, DType::kFloat64),
              IsOk());
  for (const auto& item : State("t/m").tensors) {
    EXPECT_EQ(item.value.dtype(), DType::kFloat64) << item.key;
  }
  ASSERT_THAT(store_->Delete(ctx_, Name("t/m")), IsOk());
  EXPECT_EQ(store_->size(), 0u);
  EXPECT_THAT(store_->Snapshot(Name("t/m"), {}).status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->Delete(ctx_, Name("t/m")),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(Records("move").size(), 1u);
  EXPECT_EQ(Records("delete").size(), 1u);
  // Gone from disk too.
  EXPECT_FALSE(fs::exists(Manifest("t/m")));
}

TEST_F(ModelStoreTest, QuotasLimitModulesAndBytesPerNamespace) {
  QuotaPolicy quotas;
  quotas.namespaces["few"].max_modules = 1;
  quotas.namespaces["small"].max_bytes = 100;  // Linear(4, 3): 60 bytes
  store_->set_quotas(quotas);
  ASSERT_THAT(Build("few/one").status(), IsOk());
  EXPECT_THAT(Build("few/two").status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_modules (1)")));
  ASSERT_THAT(Build("small/one").status(), IsOk());
  EXPECT_THAT(
      store_->Move(ctx_, Name("small/one"), std::nullopt, DType::kFloat64),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("max_bytes (100)")));
  EXPECT_THAT(Build("other/one").status(), IsOk());  // no quota there
}

// type(dtype) (convert_all) converts integer and bool buffers too, as
// torch's Module.type() does; to() leaves them. The quota counts what they
// become: an int8 buffer made float64 holds eight times its bytes.
TEST_F(ModelStoreTest, ATypeMoveConvertsIntegerBuffersAndCountsThem) {
  MakeDurable();
  QuotaPolicy quotas;
  quotas.namespaces["small"].max_bytes = 100;
  store_->set_quotas(quotas);
  // float32 [2] parameter (8 bytes), int8 [10] and bool [2] buffers (12).
  ASSERT_THAT(Build("small/mixed", R"({"type": "Net", "members": [
                  {"parameter": {"name": "w", "shape": [2]}},
                  {"buffer": {"name": "i", "shape": [10], "dtype": "int8",
                              "init": {"kind": "ones"}}},
                  {"buffer": {"name": "b", "shape": [2], "dtype": "bool",
                              "init": {"kind": "ones"}}}]})")
                  .status(),
              IsOk());
  // to(float64): the parameter only, 16 + 12 bytes.
  ASSERT_THAT(
      store_->Move(ctx_, Name("small/mixed"), std::nullopt, DType::kFloat64),
      IsOk());
  EXPECT_EQ(State("small/mixed").tensors.Find("i")->dtype(), DType::kInt8);
  // type(float64): 14 elements * 8 = 112 bytes, over 100; nothing changes.
  EXPECT_THAT(store_->Move(ctx_, Name("small/mixed"), std::nullopt,
                           DType::kFloat64, /*convert_all=*/true),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_bytes (100)")));
  EXPECT_EQ(State("small/mixed").tensors.Find("i")->dtype(), DType::kInt8);
  ASSERT_THAT(store_->Move(ctx_, Name("small/mixed"), std::nullopt,
                           DType::kFloat32, /*convert_all=*/true),
              IsOk());
  StateDict state = State("small/mixed");
  for (const auto& item : state.tensors) {
    EXPECT_EQ(item.value.dtype(), DType::kFloat32) << item.key;
  }
  EXPECT_EQ(HostBytes(*state.tensors.Find("b")),
            HostBytes(Filled(DType::kFloat32, {2}, 1.0)));
  // An integer dtype while the parameter requires grad: torch's words.
  EXPECT_THAT(store_->Move(ctx_, Name("small/mixed"), std::nullopt,
                           DType::kInt32, /*convert_all=*/true),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data set to a tensor that requires "
                                 "gradients must be floating point")));
  EXPECT_THAT(store_->Move(ctx_, Name("small/mixed"), std::nullopt,
                           std::nullopt, /*convert_all=*/true),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::vector<AuditRecord> moves = Records("move");
  ASSERT_EQ(moves.size(), 4u);
  EXPECT_EQ(nlohmann::json::parse(moves[0].details_json).count("convert_all"),
            0u);
  EXPECT_EQ(nlohmann::json::parse(moves[2].details_json)["convert_all"], true);
}

// torch's to() gives each slot of a tied buffer its own converted tensor,
// so the quota counts it once per slot after the move.
TEST_F(ModelStoreTest, AMoveCountsATiedBufferOncePerSlot) {
  QuotaPolicy quotas;
  quotas.namespaces["small"].max_bytes = 100;
  store_->set_quotas(quotas);
  // One float32 [10] buffer in two slots: 40 bytes, 160 as float64.
  ASSERT_THAT(Build("small/tied", R"({"type": "Net", "members": [
                  {"buffer": {"name": "a", "shape": [10],
                              "init": {"kind": "zeros"}}}],
                  "ties": [{"target": "c", "source": "a"}]})")
                  .status(),
              IsOk());
  EXPECT_THAT(
      store_->Move(ctx_, Name("small/tied"), std::nullopt, DType::kFloat64),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("max_bytes (100)")));
  // float16: 20 bytes in each slot.
  ASSERT_THAT(
      store_->Move(ctx_, Name("small/tied"), std::nullopt, DType::kFloat16),
      IsOk());
  StateDict state = State("small/tied");
  EXPECT_FALSE(
      state.tensors.Find("a")->SharesStorageWith(*state.tensors.Find("c")));
}

// Counts the registrations the in-process hooks see: a build refused by its
// quota must be refused before any of its tensors exists.
class CountingHooks {
 public:
  CountingHooks() {
    for (EntryKind kind : {EntryKind::kParameter, EntryKind::kBuffer}) {
      handles_.push_back(registry_.AddHook(kind, [this](const auto&) {
        ++seen_;
        return HookResult::Keep();
      }));
    }
  }
  const HookRegistry* registry() const { return &registry_; }
  int seen() const { return seen_; }

 private:
  std::atomic<int> seen_{0};
  HookRegistry registry_;
  std::vector<RemovableHandle> handles_;
};

TEST_F(ModelStoreTest, ABuildOverItsQuotaIsRefusedBeforeItsTensorsExist) {
  QuotaPolicy quotas;
  quotas.namespaces["small"].max_bytes = 1 << 20;
  store_->set_quotas(quotas);
  CountingHooks hooks;
  BuildOptions options;
  options.hooks = hooks.registry();
  // 4 PiB: only a refusal from the spec's shapes can answer this one.
  absl::StatusOr<BuildOutcome> huge = store_->Build(
      ctx_, Name("small/huge"),
      SpecFromJson(R"({"type": "Linear", "args": [33554432, 33554432]})"),
      options, false);
  EXPECT_THAT(huge.status(), StatusIs(absl::StatusCode::kResourceExhausted,
                                      HasSubstr("max_bytes (1048576)")));
  // 4 MiB: refused before a tensor was made (the hooks saw none).
  absl::StatusOr<BuildOutcome> big =
      store_->Build(ctx_, Name("small/big"),
                    SpecFromJson(R"({"type": "Linear", "args": [1024, 1024]})"),
                    options, false);
  EXPECT_THAT(big.status(), StatusIs(absl::StatusCode::kResourceExhausted,
                                     HasSubstr("max_bytes (1048576)")));
  EXPECT_EQ(hooks.seen(), 0);
  EXPECT_EQ(store_->size(), 0u);
  // A registration of a submodule spec is sized the same way.
  ASSERT_THAT(Build("small/m").status(), IsOk());
  RegistrationRequest add;
  add.name = "extra";
  add.kind = EntryKind::kModule;
  add.spec = SpecFromJson(R"({"type": "Linear", "args": [1024, 1024]})");
  add.build_options.hooks = hooks.registry();
  EXPECT_THAT(store_->Register(ctx_, Name("small/m"), add).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_bytes (1048576)")));
  EXPECT_EQ(hooks.seen(), 0);
}

TEST_F(ModelStoreTest, AnAssigningLoadCountsAgainstTheQuota) {
  QuotaPolicy quotas;
  quotas.namespaces["small"].max_bytes = 100;  // Linear(4, 3): 60 bytes
  store_->set_quotas(quotas);
  ASSERT_THAT(Build("small/m").status(), IsOk());
  // float64 values installed in place of float32 ones: 120 bytes.
  StateDict wide;
  wide.tensors.Set("weight", Filled(DType::kFloat64, {3, 4}, 1));
  wide.tensors.Set("bias", Filled(DType::kFloat64, {3}, 1));
  LoadOptions assign;
  assign.assign = true;
  EXPECT_THAT(store_->Load(ctx_, Name("small/m"), wide, assign).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_bytes (100)")));
  EXPECT_EQ(State("small/m").tensors.Find("weight")->dtype(), DType::kFloat32);
  // The same values copied into the float32 tensors fit.
  EXPECT_THAT(store_->Load(ctx_, Name("small/m"), wide, {}).status(), IsOk());
  // A same-sized assignment fits too: the old values stop counting.
  StateDict same = Pattern(2);
  EXPECT_THAT(store_->Load(ctx_, Name("small/m"), same, assign).status(),
              IsOk());
}

// One weight tied into four modules is one tensor; an assigning load
// installs a tensor of its own in each of the four slots. The quota counts
// the four, and a shared submodule's two paths still count one slot each.
TEST_F(ModelStoreTest, AnAssigningLoadIntoATiedWeightCountsEveryNewTensor) {
  QuotaPolicy quotas;
  quotas.namespaces["small"].max_bytes = 200;
  store_->set_quotas(quotas);
  // w: 16 float32 = 64 bytes, held once though four modules hold it.
  ASSERT_THAT(store_
                  ->Build(ctx_, Name("small/tied"), SpecFromJson(R"({
      "type": "Root",
      "members": [
        {"parameter": {"name": "w", "shape": [16]}},
        {"module": {"name": "a", "spec": {"type": "Leaf", "custom": true}}},
        {"module": {"name": "b", "spec": {"type": "Leaf", "custom": true}}},
        {"module": {"name": "c", "spec": {"type": "Leaf", "custom": true}}}],
      "ties": [{"target": "a.w", "source": "w"},
               {"target": "b.w", "source": "w"},
               {"target": "c.w", "source": "w"}]})"),
                          BuildOptions(), false)
                  .status(),
              IsOk());
  StateDict four;
  for (const char* key : {"w", "a.w", "b.w", "c.w"}) {
    four.tensors.Set(key, Filled(DType::kFloat32, {16}, 1));
  }
  LoadOptions assign;
  assign.assign = true;
  // 4 x 64 = 256 bytes once installed.
  EXPECT_THAT(store_->Load(ctx_, Name("small/tied"), four, assign).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_bytes (200)")));
  // Copied into the one tied tensor, the same values fit.
  EXPECT_THAT(store_->Load(ctx_, Name("small/tied"), four, {}).status(),
              IsOk());
  ASSERT_THAT(store_->Delete(ctx_, Name("small/tied")), IsOk());
  // A submodule at two paths is one module: its slots get one new tensor
  // each, 60 bytes in all, as before.
  ASSERT_THAT(store_
                  ->Build(ctx_, Name("small/shared"), SpecFromJson(R"({
      "type": "Sequential", "children": [
        {"spec": {"type": "Linear", "args": [4, 3]}},
        {"spec": {"ref": "0"}},
        {"spec": {"type": "Linear", "args": [4, 3]}}]})"),
                          BuildOptions(), false)
                  .status(),
              IsOk());
  StateDict both;
  for (const char* path : {"0", "1", "2"}) {
    both.tensors.Set(absl::StrCat(path, ".weight"),
                     Filled(DType::kFloat32, {3, 4}, 2));
    both.tensors.Set(absl::StrCat(path, ".bias"),
                     Filled(DType::kFloat32, {3}, 2));
  }
  EXPECT_THAT(store_->Load(ctx_, Name("small/shared"), both, assign).status(),
              IsOk());
}

// Every build waits in the decider until all twelve are there (or 100 ms
// passed): twelve quota checks at once, then twelve inserts.
class GatheringDecider : public RegistrationDecider {
 public:
  std::vector<HookDecision> Decide(
      const OperationContext&, const ModuleName&,
      absl::Span<const RegistrationRecord> records) override {
    {
      absl::MutexLock lock(&mu_);
      ++arrived_;
      auto all_here = [this] { return arrived_ >= 12; };
      mu_.AwaitWithTimeout(absl::Condition(&all_here), absl::Milliseconds(100));
    }
    std::vector<HookDecision> out;
    for (const RegistrationRecord& r : records) out.push_back(r.local);
    return out;
  }

 private:
  absl::Mutex mu_;
  int arrived_ = 0;
};

// Replaces every tensor registration with 64 float32s (256 bytes), as a
// subscriber's MODIFY answer may.
class FatteningDecider : public RegistrationDecider {
 public:
  std::vector<HookDecision> Decide(
      const OperationContext&, const ModuleName&,
      absl::Span<const RegistrationRecord> records) override {
    std::vector<HookDecision> out;
    for (const RegistrationRecord& r : records) {
      HookDecision d = r.local;
      if (r.event.kind == EntryKind::kBuffer) {
        d.kind = HookResult::Kind::kReplace;
        d.value.tensor = Filled(DType::kFloat32, {64}, 1);
        d.reason = "fattened";
      }
      out.push_back(d);
    }
    return out;
  }
};

TEST_F(ModelStoreTest, AReplacementInARegistrationCountsAgainstTheQuota) {
  QuotaPolicy quotas;
  quotas.namespaces["small"].max_bytes = 200;  // Linear(4, 3): 60 bytes
  store_->set_quotas(quotas);
  ASSERT_THAT(Build("small/m").status(), IsOk());
  FatteningDecider decider;
  store_->set_decider(&decider);
  // 8 bytes asked for, 256 stored: past the quota, so refused.
  RegistrationRequest add;
  add.name = "running";
  add.kind = EntryKind::kBuffer;
  add.value.tensor = Filled(DType::kFloat32, {2}, 5);
  EXPECT_THAT(store_->Register(ctx_, Name("small/m"), add).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_bytes (200)")));
  // The same for a buffer of a submodule built from a spec.
  RegistrationRequest sub;
  sub.name = "norm";
  sub.kind = EntryKind::kModule;
  sub.spec = SpecFromJson(
      R"({"type": "Stats", "members": [{"buffer": {"name": "b", "shape": [2]}}]})");
  EXPECT_THAT(store_->Register(ctx_, Name("small/m"), sub).status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_bytes (200)")));
  store_->set_decider(nullptr);
  EXPECT_EQ(State("small/m").tensors.Keys(),
            (std::vector<std::string>{"weight", "bias"}));
  // Kept as asked, both fit.
  EXPECT_THAT(store_->Register(ctx_, Name("small/m"), add).status(), IsOk());
  EXPECT_THAT(store_->Register(ctx_, Name("small/m"), sub).status(), IsOk());
}

TEST_F(ModelStoreTest, ConcurrentBuildsNeverExceedMaxModules) {
  // Ten rounds, each in its own namespace. Saved builds: a quota check
  // that counted the modules, then waits to read one being saved, must not
  // insert on a stale count.
  MakeDurable();
  QuotaPolicy quotas;
  quotas.defaults.max_modules = 3;
  quotas.defaults.max_bytes = 1 << 30;
  store_->set_quotas(quotas);
  for (int round = 0; round < 10; ++round) {
    GatheringDecider decider;
    store_->set_decider(&decider);
    std::atomic<int> built{0};
    std::atomic<int> refused{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 12; ++i) {
      threads.emplace_back([&, i] {
        absl::Status s = Build(absl::StrCat("r", round, "/m", i)).status();
        if (s.ok()) ++built;
        if (absl::IsResourceExhausted(s)) ++refused;
      });
    }
    for (std::thread& t : threads) t.join();
    store_->set_decider(nullptr);
    ASSERT_EQ(built, 3) << "round " << round;
    ASSERT_EQ(refused, 9) << "round " << round;
    ASSERT_EQ(store_->List(absl::StrCat("r", round), "", 100).size(), 3u);
  }
}

TEST_F(ModelStoreTest, ListsInNameOrderFromAfterAndPerNamespace) {
  for (const char* name : {"b/two", "a/one", "b/one", "a/two", "c/one"}) {
    ASSERT_THAT(Build(name).status(), IsOk());
  }
  auto names = [](const std::vector<ModuleSummary>& list) {
    std::vector<std::string> out;
    for (const ModuleSummary& m : list) out.push_back(m.name.full());
    return out;
  };
  EXPECT_THAT(names(store_->List("", "", 2)), ElementsAre("a/one", "a/two"));
  EXPECT_THAT(names(store_->List("", "a/two", 2)),
              ElementsAre("b/one", "b/two"));
  EXPECT_THAT(names(store_->List("b", "", 10)), ElementsAre("b/one", "b/two"));
  std::vector<ModuleSummary> one = store_->List("c", "", 10);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].type, "Linear");
  EXPECT_EQ(one[0].num_parameters, 15u);
  EXPECT_EQ(one[0].total_bytes, 60u);
  EXPECT_THAT(one[0].devices, ElementsAre("cpu"));
}

// Readers never see a half-applied load: every snapshot is one pattern.
TEST_F(ModelStoreTest, ConcurrentReadersSeeOnlyWholeStates) {
  MakeDurable();
  ASSERT_THAT(Build("t/m").status(), IsOk());
  ASSERT_THAT(store_->Load(ctx_, Name("t/m"), Pattern(0), {}).status(), IsOk());
  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::atomic<int> reads{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&] {
      while (!done) {
        absl::StatusOr<StateDictSnapshot> s = store_->Snapshot(Name("t/m"), {});
        if (!s.ok()) continue;
        const float first = s->state.tensors.Find("weight")->data<float>()[0];
        if (!AllEqual(s->state, first)) ++torn;
        ++reads;
      }
    });
  }
  std::thread writer([&] {
    for (int i = 1; i <= 30; ++i) {
      EXPECT_THAT(store_->Load(ctx_, Name("t/m"), Pattern(i), {}).status(),
                  IsOk());
    }
  });
  writer.join();
  done = true;
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(torn, 0);
  EXPECT_GT(reads, 0);
  EXPECT_TRUE(AllEqual(State("t/m"), 30));
}

// Holds every decision until released.
class BlockingDecider : public RegistrationDecider {
 public:
  std::vector<HookDecision> Decide(
      const OperationContext&, const ModuleName&,
      absl::Span<const RegistrationRecord> records) override {
    deciding_.Notify();
    release_.WaitForNotification();
    std::vector<HookDecision> out;
    for (const RegistrationRecord& r : records) {
      HookDecision d = r.local;
      if (block_) {
        d.kind = HookResult::Kind::kBlock;
        d.reason = "held and refused";
      }
      out.push_back(std::move(d));
    }
    return out;
  }
  absl::Notification deciding_;
  absl::Notification release_;
  bool block_ = false;
};

TEST_F(ModelStoreTest, ADeciderHoldsWritersOfTheModuleButNotItsReaders) {
  ASSERT_THAT(Build("t/m").status(), IsOk());
  BlockingDecider decider;
  decider.block_ = true;
  store_->set_decider(&decider);
  RegistrationRequest add;
  add.name = "extra";
  add.kind = EntryKind::kBuffer;
  add.value.tensor = Filled(DType::kFloat32, {1}, 1);
  absl::StatusOr<std::vector<RegistrationResult>> registered;
  std::thread registering(
      [&] { registered = store_->Register(ctx_, Name("t/m"), add); });
  ASSERT_TRUE(
      decider.deciding_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  // While the decision is pending: readers go on, another writer waits.
  EXPECT_EQ(State("t/m").tensors.size(), 2u);
  std::atomic<bool> trained{false};
  std::thread training([&] {
    EXPECT_THAT(store_->SetTraining(ctx_, Name("t/m"), false), IsOk());
    trained = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(trained);
  decider.release_.Notify();
  registering.join();
  training.join();
  EXPECT_TRUE(trained);
  EXPECT_THAT(registered.status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("was blocked: held and refused")));
  EXPECT_EQ(State("t/m").tensors.size(), 2u);  // nothing registered
  store_->set_decider(nullptr);
}

// Concurrent builds of one new name: while the first holds the namespace's
// last max_modules slot (its hooks deciding), the others wait for it and
// are then ALREADY_EXISTS, not RESOURCE_EXHAUSTED for the slot it held.
TEST_F(ModelStoreTest, ABuildOfANameBeingBuiltIsAlreadyExistsNotOverQuota) {
  QuotaPolicy quotas;
  quotas.defaults.max_modules = 2;
  store_->set_quotas(quotas);
  ASSERT_THAT(Build("t/one").status(), IsOk());
  BlockingDecider decider;
  store_->set_decider(&decider);
  absl::StatusOr<BuildOutcome> first;
  std::thread building([&] { first = Build("t/new"); });
  ASSERT_TRUE(
      decider.deciding_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  std::vector<absl::StatusOr<BuildOutcome>> others(7);
  std::atomic<int> returned{0};
  std::vector<std::thread> waiting;
  for (auto& other : others) {
    waiting.emplace_back([&] {
      other = Build("t/new");
      ++returned;
    });
  }
  ASSERT_TRUE(AwaitWaiters(Name("t/new"), 7));
  EXPECT_EQ(returned, 0);  // they wait for the first
  decider.release_.Notify();
  building.join();
  for (std::thread& t : waiting) t.join();
  store_->set_decider(nullptr);
  EXPECT_THAT(first.status(), IsOk());
  for (const auto& other : others) {
    EXPECT_THAT(other.status(), StatusIs(absl::StatusCode::kAlreadyExists,
                                         HasSubstr("'t/new' already exists")));
  }
  EXPECT_THAT(Build("t/x").status(),
              StatusIs(absl::StatusCode::kResourceExhausted));
  quotas.defaults.max_modules = 3;
  store_->set_quotas(quotas);
  EXPECT_THAT(Build("t/x").status(), IsOk());
}

// A build that waited for another of the same name which then stored
// nothing (its hooks blocked an all_or_nothing build) builds the name
// itself: being told ALREADY_EXISTS for a name left free would be false.
TEST_F(ModelStoreTest, ABuildWaitingForOneThatStoresNothingBuildsTheName) {
  QuotaPolicy quotas;
  quotas.defaults.max_modules = 1;
  store_->set_quotas(quotas);
  BlockingDecider decider;
  decider.block_ = true;
  store_->set_decider(&decider);
  absl::StatusOr<BuildOutcome> first;
  std::thread building([&] {
    BuildOptions options;
    options.hooks = nullptr;
    first = store_->Build(ctx_, Name("t/new"), SpecFromJson(kLinear), options,
                          /*all_or_nothing=*/true);
  });
  ASSERT_TRUE(
      decider.deciding_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::StatusOr<BuildOutcome> second;
  std::atomic<bool> returned{false};
  std::thread waiting([&] {
    second = Build("t/new");
    returned = true;
  });
  ASSERT_TRUE(AwaitWaiters(Name("t/new"), 1));
  EXPECT_FALSE(returned);
  // The first holds the decider it asked; the second's registrations pass.
  store_->set_decider(nullptr);
  decider.release_.Notify();
  building.join();
  waiting.join();
  EXPECT_THAT(first.status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                       HasSubstr("stored nothing")));
  EXPECT_THAT(second.status(), IsOk());
  EXPECT_EQ(State("t/new").tensors.size(), 2u);
}

// The wait for another build of the name lasts as long as the call: its
// deadline, or its client's cancellation, ends it with nothing claimed.
TEST_F(ModelStoreTest, AWaitForAnotherBuildEndsAtTheCallsDeadlineOrCancel) {
  BlockingDecider decider;
  store_->set_decider(&decider);
  absl::StatusOr<BuildOutcome> first;
  std::thread building([&] { first = Build("t/new"); });
  ASSERT_TRUE(
      decider.deciding_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  BuildOptions options;
  options.hooks = nullptr;
  OperationContext late = ctx_;
  late.deadline = absl::Now() + absl::Milliseconds(50);
  EXPECT_THAT(
      store_->Build(late, Name("t/new"), SpecFromJson(kLinear), options, false)
          .status(),
      StatusIs(absl::StatusCode::kDeadlineExceeded,
               HasSubstr("another build of 't/new'")));
  std::atomic<bool> cancel{false};
  OperationContext cancelled = ctx_;
  cancelled.cancelled = [&] { return cancel.load(); };
  absl::StatusOr<BuildOutcome> third;
  std::thread waiting([&] {
    third = store_->Build(cancelled, Name("t/new"), SpecFromJson(kLinear),
                          options, false);
  });
  ASSERT_TRUE(AwaitWaiters(Name("t/new"), 1));
  cancel = true;
  waiting.join();  // before the first is released
  EXPECT_THAT(third.status(), StatusIs(absl::StatusCode::kCancelled));
  decider.release_.Notify();
  building.join();
  store_->set_decider(nullptr);
  EXPECT_THAT(first.status(), IsOk());
}

// A build that waited for another of its name asks ctx.still_allowed once
// the wait is over, before it learns whether the name exists or builds: a
// caller revoked during the wait gets that refusal and builds nothing. A
// build that did not wait is not asked (its call was authorised as it
// began).
TEST_F(ModelStoreTest, ABuildThatWaitedIsAskedAgainWhetherItMayGoOn) {
  BlockingDecider decider;
  decider.block_ = true;
  store_->set_decider(&decider);
  BuildOptions options;
  options.hooks = nullptr;
  absl::StatusOr<BuildOutcome> first;
  std::thread building([&] {
    first = store_->Build(ctx_, Name("t/new"), SpecFromJson(kLinear), options,
                          /*all_or_nothing=*/true);
  });
  ASSERT_TRUE(
      decider.deciding_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  std::atomic<int> asked{0};
  OperationContext revoked = ctx_;
  revoked.still_allowed = [&] {
    ++asked;
    return absl::PermissionDeniedError("revoked while waiting");
  };
  absl::StatusOr<BuildOutcome> second;
  std::thread waiting([&] {
    second = store_->Build(revoked, Name("t/new"), SpecFromJson(kLinear),
                           options, false);
  });
  ASSERT_TRUE(AwaitWaiters(Name("t/new"), 1));
  EXPECT_EQ(asked, 0);  // not while it waits
  store_->set_decider(nullptr);
  decider.release_.Notify();
  building.join();
  waiting.join();
  EXPECT_THAT(first.status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                       HasSubstr("stored nothing")));
  EXPECT_THAT(second.status(), StatusIs(absl::StatusCode::kPermissionDenied,
                                        HasSubstr("revoked while waiting")));
  EXPECT_EQ(asked, 1);
  EXPECT_THAT(store_->Incarnation(Name("t/new")).status(),
              StatusIs(absl::StatusCode::kNotFound));
  // The refused waiter let the name go: a build without a wait is not
  // asked, and builds it.
  EXPECT_THAT(
      store_
          ->Build(revoked, Name("t/new"), SpecFromJson(kLinear), options, false)
          .status(),
      IsOk());
  EXPECT_EQ(asked, 1);
}

// At most max_build_waiters builds wait for another build of one name; the
// next is RESOURCE_EXHAUSTED at once, naming the limit, and the waiters go
// on as before.
TEST_F(ModelStoreTest, BuildsWaitingForOneNameAreBounded) {
  store_->set_max_build_waiters(1);
  BlockingDecider decider;
  store_->set_decider(&decider);
  absl::StatusOr<BuildOutcome> first;
  std::thread building([&] { first = Build("t/new"); });
  ASSERT_TRUE(
      decider.deciding_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::StatusOr<BuildOutcome> second;
  std::thread waiting([&] { second = Build("t/new"); });
  ASSERT_TRUE(AwaitWaiters(Name("t/new"), 1));
  // With a deadline: were this one to wait, the test would fail, not hang.
  OperationContext probe = ctx_;
  probe.deadline = absl::Now() + absl::Seconds(5);
  BuildOptions no_hooks;
  no_hooks.hooks = nullptr;
  EXPECT_THAT(
      store_
          ->Build(probe, Name("t/new"), SpecFromJson(kLinear), no_hooks, false)
          .status(),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("module: another build of 't/new'"),
                     HasSubstr("max_build_waiters"))));
  decider.release_.Notify();
  building.join();
  waiting.join();
  store_->set_decider(nullptr);
  EXPECT_THAT(first.status(), IsOk());
  EXPECT_THAT(second.status(), StatusIs(absl::StatusCode::kAlreadyExists));
}

// A module deleted while a streamed load's bytes come: the load fails
// NOT_FOUND (not INTERNAL about a rename), recorded, and leaves no module
// directory behind.
TEST_F(ModelStoreTest, AStreamedLoadOfAModuleDeletedMeanwhileIsNotFound) {
  MakeDurable();
  ASSERT_THAT(Build("t/m").status(), IsOk());
  StateDict state = Pattern(3);
  auto reader = *StateDictReader::Create(state, std::nullopt);
  {
    std::unique_ptr<StagedStateDict> staged = *store_->StageLoad(
        ctx_, Name("t/m"), reader->layout(), StreamLimits{}, {}, dir_.string());
    ASSERT_THAT(store_->Delete(ctx_, Name("t/m")), IsOk());
    while (reader->remaining() > 0) {
      std::string bytes;
      ASSERT_GT(*reader->Read(1 << 10, &bytes), 0u);
      ASSERT_THAT(staged->Append(std::move(bytes)), IsOk());
    }
    EXPECT_THAT(store_->LoadStaged(ctx_, Name("t/m"), *staged, {}).status(),
                StatusIs(absl::StatusCode::kNotFound));
  }
  // The directory goes with whichever comes last: the staged file's
  // release, or the deletion's tombstone.
  repository_->WaitForDeletions();
  EXPECT_FALSE(fs::exists(
      data_dir::ModuleDir((dir_ / "modules").string(), Name("t/m"))));
  EXPECT_EQ(Records("load_state_dict").size(), 1u);
}

// Deleted and built again while a streamed load's bytes come: the bytes
// were for the module that is gone, so the new one under the name is left
// as it is (ABORTED, recorded), and its files with it.
TEST_F(ModelStoreTest, AStreamedLoadNeverLandsInAModuleBuiltAgainMeanwhile) {
  MakeDurable();
  ASSERT_THAT(Build("t/m").status(), IsOk());
  const uint64_t began = *store_->Incarnation(Name("t/m"));
  StateDict state = Pattern(3);
  auto reader = *StateDictReader::Create(state, std::nullopt);
  {
    std::unique_ptr<StagedStateDict> staged = *store_->StageLoad(
        ctx_, Name("t/m"), reader->layout(), StreamLimits{}, {}, dir_.string());
    ASSERT_THAT(store_->Delete(ctx_, Name("t/m")), IsOk());
    ASSERT_THAT(Build("t/m").status(), IsOk());
    EXPECT_NE(*store_->Incarnation(Name("t/m")), began);
    const StateDict rebuilt = State("t/m");
    while (reader->remaining() > 0) {
      std::string bytes;
      ASSERT_GT(*reader->Read(1 << 10, &bytes), 0u);
      ASSERT_THAT(staged->Append(std::move(bytes)), IsOk());
    }
    EXPECT_THAT(
        store_->LoadStaged(ctx_, Name("t/m"), *staged, {}, "", began).status(),
        StatusIs(absl::StatusCode::kAborted,
                 HasSubstr("was deleted and built again")));
    ExpectSameState(State("t/m"), rebuilt);
  }
  // The same for a load that assembles its bytes in memory.
  EXPECT_THAT(store_->Load(ctx_, Name("t/m"), state, {}, "", began).status(),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(Records("load_state_dict").size(), 2u);
  // What is on disk is the module built again.
  const StateDict rebuilt = State("t/m");
  repository_->WaitForDeletions();
  ModelStore::RestoreReport report = Restart();
  EXPECT_THAT(report.errors, IsEmpty());
  EXPECT_EQ(report.modules, 1u);
  ExpectSameState(State("t/m"), rebuilt);
}

// The write permission is asked exactly when a call will change the
// module: an eval call through an Embedding with max_norm, not one through
// a Linear. Refused, it changes and records nothing.
TEST_F(ModelStoreTest, AForwardAsksToChangeOnlyWhenItWill) {
  MakeDurable();
  ASSERT_THAT(Build("t/lin").status(), IsOk());
  ASSERT_THAT(Build("t/emb", R"({"type": "Embedding", "args": [10, 4],
                                  "kwargs": {"max_norm": 0.5}})")
                  .status(),
              IsOk());
  int asked = 0;
  auto refuse = [&] {
    ++asked;
    return absl::PermissionDeniedError("no writes here");
  };
  EXPECT_THAT(
      store_
          ->Forward(ctx_, Name("t/lin"), "",
                    {Filled(DType::kFloat32, {2, 4}, 1)}, false, 0, refuse)
          .status(),
      IsOk());
  EXPECT_EQ(asked, 0);
  const StateDict before = State("t/emb");
  const Tensor indices = *Tensor::FromDoubles(DType::kInt64, {3}, {1, 2, 3});
  EXPECT_THAT(
      store_->Forward(ctx_, Name("t/emb"), "", {indices}, false, 0, refuse)
          .status(),
      StatusIs(absl::StatusCode::kPermissionDenied, "no writes here"));
  EXPECT_EQ(asked, 1);
  const StateDict after = State("t/emb");
  ASSERT_NE(after.tensors.Find("weight"), nullptr);
  EXPECT_EQ(std::memcmp(before.tensors.Find("weight")->raw_data(),
                        after.tensors.Find("weight")->raw_data(), 40 * 4),
            0);
  EXPECT_THAT(Records("forward"), ::testing::IsEmpty());
  // Allowed, the same call renormalises and is recorded.
  ASSERT_THAT(store_
                  ->Forward(ctx_, Name("t/emb"), "", {indices}, false, 0,
                            [] { return absl::OkStatus(); })
                  .status(),
              IsOk());
  EXPECT_EQ(Records("forward").size(), 1u);
}

// An eval-mode forward only reads: readers (and other eval forwards) go on
// while it runs; a training-mode one still excludes them.
TEST_F(ModelStoreTest, AnEvalForwardIsAReader) {
  ASSERT_THAT(Build("t/m").status(), IsOk());
  ASSERT_THAT(store_->SetTraining(ctx_, Name("t/m"), false), IsOk());
  absl::Notification in_forward;
  absl::Notification release;
  RemovableHandle hook = ForwardHookList::Global().AddHook(
      [&](Module&, const std::vector<Tensor>&,
          const std::vector<Tensor>&) -> ForwardHookResult {
        in_forward.Notify();
        release.WaitForNotificationWithTimeout(absl::Seconds(30));
        return std::nullopt;
      });
  std::thread forward([&] {
    EXPECT_THAT(store_
                    ->Forward(ctx_, Name("t/m"), "",
                              {Filled(DType::kFloat32, {2, 4}, 1)},
                              std::nullopt, 0, [] { return absl::OkStatus(); })
                    .status(),
                IsOk());
  });
  ASSERT_TRUE(in_forward.WaitForNotificationWithTimeout(absl::Seconds(30)));
  absl::Notification read;
  std::thread reader([&] {
    EXPECT_EQ(State("t/m").tensors.size(), 2u);
    read.Notify();
  });
  EXPECT_TRUE(read.WaitForNotificationWithTimeout(absl::Seconds(5)))
      << "a reader waited behind an eval forward";
  release.Notify();
  forward.join();
  reader.join();
  hook.Remove();
}

// A second store, as another replica would hold it, for cluster moves.
struct OtherReplica {
  explicit OtherReplica(const fs::path& dir) {
    fs::create_directories(dir);
    audit = *AuditLog::Open((dir / "audit.log").string());
    repository = *ModuleRepository::Open((dir / "modules").string());
    store = std::make_unique<ModelStore>();
    store->set_audit_log(audit.get());
    store->set_repository(repository.get());
  }
  ~OtherReplica() {
    store.reset();
    repository.reset();
    audit.reset();
  }
  std::unique_ptr<AuditLog> audit;
  std::unique_ptr<ModuleRepository> repository;
  std::unique_ptr<ModelStore> store;
};

// What the cluster service does with a move's files, without the wire:
// each data file copied to a path the target reserved, then MoveIn.
absl::StatusOr<uint64_t> SendTo(ModelStore& target, const ModuleName& name,
                                const std::vector<std::string>& files,
                                absl::FunctionRef<absl::Status()> take) {
  std::map<std::string, std::string> received;
  uint64_t bytes = 0;
  for (size_t i = 0; i + 1 < files.size(); ++i) {
    MODELSTATE_ASSIGN_OR_RETURN(std::string path,
                                target.ReserveImportFile(name));
    fs::copy_file(files[i], path, fs::copy_options::overwrite_existing);
    bytes += fs::file_size(path);
    received[fs::path(files[i]).filename().string()] = path;
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::string manifest, ReadFile(files.back()));
  bytes += manifest.size();
  MODELSTATE_RETURN_IF_ERROR(target.MoveIn(OperationContext{"admin", "mv"},
                                           name, "here", manifest, received,
                                           bytes, take));
  return bytes;
}

TEST_F(ModelStoreTest, AClusterMoveHandsTheModuleAndItsRecordOver) {
  MakeDurable();
  ASSERT_THAT(Build("t/m").status(), IsOk());
  ASSERT_THAT(store_->Load(ctx_, Name("t/m"), Pattern(2.5f), {}).status(),
              IsOk());
  const StateDict before = State("t/m");
  OtherReplica other(dir_ / "other");
  auto ok = [] { return absl::OkStatus(); };
  uint64_t sent = 0;
  ASSERT_THAT(
      store_->MoveOut(ctx_, Name("t/m"), "there",
                      [&](const std::vector<std::string>& files)
                          -> absl::StatusOr<uint64_t> {
                        MODELSTATE_ASSIGN_OR_RETURN(
                            sent, SendTo(*other.store, Name("t/m"), files, ok));
                        return sent;
                      }),
      IsOk());
  EXPECT_GT(sent, 0u);
  EXPECT_FALSE(store_->Contains(Name("t/m")));
  EXPECT_FALSE(fs::exists(Manifest("t/m")));
  absl::StatusOr<StateDictSnapshot> moved =
      other.store->Snapshot(Name("t/m"), {});
  ASSERT_THAT(moved.status(), IsOk());
  ExpectSameState(moved->state, before);
  ASSERT_THAT(Records("move_out"), SizeIs(1));
  EXPECT_EQ(
      nlohmann::json::parse(Records("move_out")[0].details_json)["to_replica"],
      "there");
  AuditQuery query;
  query.type = "move_in";
  std::vector<AuditRecord> in = *other.audit->Query(query);
  ASSERT_THAT(in, SizeIs(1));
  const nlohmann::json details = nlohmann::json::parse(in[0].details_json);
  EXPECT_EQ(details["from_replica"], "here");
  EXPECT_EQ(details["bytes"], sent);
  // The target's saved state names its own change: a restart takes it
  // back without a "recovered" record or a refusal.
  const fs::path other_dir = dir_ / "other";
  other.store.reset();
  other.repository = *ModuleRepository::Open((other_dir / "modules").string());
  other.store = std::make_unique<ModelStore>();
  other.store->set_audit_log(other.audit.get());
  other.store->set_repository(other.repository.get());
  ModelStore::RestoreReport report = other.store->Restore();
  EXPECT_THAT(report.refused, IsOk());
  EXPECT_EQ(report.modules, 1u);
  EXPECT_EQ(report.recovered, 0u);
  EXPECT_THAT(report.errors, IsEmpty());
}

// A module without tensors moves as its manifest alone, into a data
// directory that never had its namespace.
TEST_F(ModelStoreTest, AModuleWithoutTensorsMovesToo) {
  MakeDurable();
  ASSERT_THAT(Build("t/relu", R"({"type": "ReLU"})").status(), IsOk());
  OtherReplica other(dir_ / "other");
  auto ok = [] { return absl::OkStatus(); };
  ASSERT_THAT(store_->MoveOut(ctx_, Name("t/relu"), "there",
                              [&](const std::vector<std::string>& files) {
                                EXPECT_THAT(files, SizeIs(1));
                                return SendTo(*other.store, Name("t/relu"),
                                              files, ok);
                              }),
              IsOk());
  EXPECT_TRUE(other.store->Contains(Name("t/relu")));
  EXPECT_FALSE(store_->Contains(Name("t/relu")));
}

// A cluster move marks the module's files on both replicas before they can
// be a copy no replica owns (the sender before any file leaves, the
// receiver before its manifest commits), until the cluster names the
// owner: a restart then hosts a marked copy only where etcd names this
// replica (ClusterMember::Join), so a crash half-way cannot bring back a
// module its owner deleted. The mark goes with a moved module's files, and
// a failed move's stays until the caller settles it.
TEST_F(ModelStoreTest, AClusterMoveIsMarkedUntilTheOwnerIsSettled) {
  MakeDurable();
  ASSERT_THAT(Build("t/m").status(), IsOk());
  OtherReplica other(dir_ / "other");
  const std::string source_dir =
      data_dir::ModuleDir((dir_ / "modules").string(), Name("t/m"));
  const std::string target_dir =
      data_dir::ModuleDir((dir_ / "other" / "modules").string(), Name("t/m"));
  EXPECT_FALSE(store_->InMove(Name("t/m")));
  bool marked_when_sent = false;
  bool committed_and_marked_at_takeover = false;
  auto take = [&] {
    committed_and_marked_at_takeover =
        other.store->InMove(Name("t/m")) &&
        fs::exists(data_dir::ManifestPath(target_dir));
    return absl::OkStatus();
  };
  ASSERT_THAT(store_->MoveOut(ctx_, Name("t/m"), "there",
                              [&](const std::vector<std::string>& files) {
                                marked_when_sent = store_->InMove(Name("t/m"));
                                return SendTo(*other.store, Name("t/m"), files,
                                              take);
                              }),
              IsOk());
  EXPECT_TRUE(marked_when_sent);
  EXPECT_TRUE(committed_and_marked_at_takeover);
  // Owned there: settled. Gone here, directory and all.
  ASSERT_TRUE(other.store->Contains(Name("t/m")));
  EXPECT_FALSE(other.store->InMove(Name("t/m")));
  repository_->WaitForDeletions();
  EXPECT_FALSE(fs::exists(source_dir));

  // A move that fails drops its mark when the cluster names this replica
  // the owner still...
  ASSERT_THAT(Build("t/n").status(), IsOk());
  EXPECT_THAT(MoveOutCutOff("t/n",
                            [](const absl::Status& failure) {
                              return failure.code() ==
                                     absl::StatusCode::kUnavailable;
                            }),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_FALSE(store_->InMove(Name("t/n")));
  // ... and keeps it otherwise (the takeover may have happened before the
  // failure), across a restart, until it is settled.
  EXPECT_THAT(MoveOutCutOff("t/n", [](const absl::Status&) { return false; }),
              StatusIs(absl::StatusCode::kUnavailable));
  const std::string n_dir =
      data_dir::ModuleDir((dir_ / "modules").string(), Name("t/n"));
  absl::StatusOr<std::string> text = ReadFile(data_dir::MoveMarkPath(n_dir));
  ASSERT_THAT(text.status(), IsOk());
  EXPECT_EQ(nlohmann::json::parse(*text),
            (nlohmann::json{{"move", "out"}, {"peer", "there"}}));
  ASSERT_THAT(store_->Load(ctx_, Name("t/n"), Pattern(3), {}).status(), IsOk());
  EXPECT_TRUE(Restart().errors.empty());
  EXPECT_TRUE(store_->Contains(Name("t/n")));
  EXPECT_TRUE(store_->InMove(Name("t/n")));
  EXPECT_TRUE(AllEqual(State("t/n"), 3));
  ASSERT_THAT(store_->SettleMove(Name("t/n")), IsOk());
  EXPECT_FALSE(store_->InMove(Name("t/n")));
  EXPECT_THAT(store_->SettleMove(Name("t/n")), IsOk());  // none: OK

  // A deletion takes a mark with the files, and the directory goes.
  EXPECT_THAT(MoveOutCutOff("t/n"), StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_TRUE(store_->InMove(Name("t/n")));
  ASSERT_THAT(store_->Delete(ctx_, Name("t/n")), IsOk());
  repository_->WaitForDeletions();
  EXPECT_FALSE(fs::exists(n_dir));
}

// Flips one byte `from_end` bytes before the end of every data file of
// `name` (a Linear's bias is its file's last tensor).
void DamageDataFiles(const fs::path& modules, const ModuleName& name,
                     int from_end) {
  for (const auto& f :
       fs::directory_iterator(data_dir::ModuleDir(modules.string(), name))) {
    if (f.path().extension() != ".safetensors") continue;
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(-from_end, std::ios::end);
    char c;
    io.read(&c, 1);
    c ^= 0x10;
    io.seekp(-from_end, std::ios::end);
    io.write(&c, 1);
  }
}

// A copy another replica owns: no longer served, its files kept out of the
// modules directory (so no restart loads it again), recorded; a copy whose
// name is being written to is left where it is.
TEST_F(ModelStoreTest, ASetAsideCopyIsKeptButNeverServedAgain) {
  MakeDurable();
  ASSERT_THAT(Build("t/m").status(), IsOk());
  ASSERT_THAT(Build("t/kept").status(), IsOk());
  ASSERT_THAT(store_->Load(ctx_, Name("t/m"), Pattern(7), {}).status(), IsOk());
  const std::string aside =
      data_dir::SetAsidePath(dir_.string(), Name("t/m"), "20261129T000000Z");
  ASSERT_THAT(store_->SetAside(Name("t/m"), "r2", aside), IsOk());
  EXPECT_THAT(store_->Snapshot(Name("t/m"), {}).status(),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(fs::exists(Manifest("t/m")));
  EXPECT_TRUE(fs::exists(data_dir::ManifestPath(aside)));
  std::vector<AuditRecord> records = Records("set_aside");
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].outcome, "ok");
  nlohmann::json details = nlohmann::json::parse(records[0].details_json);
  EXPECT_EQ(details["owner"], "r2");
  EXPECT_EQ(details["path"], aside);
  ModelStore::RestoreReport report = Restart();
  EXPECT_EQ(report.modules, 1u);
  EXPECT_TRUE(report.errors.empty());
  EXPECT_FALSE(store_->Contains(Name("t/m")));
  // The kept files are the copy as it was, bit for bit.
  auto copy = *ModuleRepository::Open((dir_ / "copy").string());
  fs::create_directories(dir_ / "copy" / "t");
  fs::rename(aside, data_dir::ModuleDir((dir_ / "copy").string(), Name("t/m")));
  ModuleRepository::LoadReport loaded = copy->LoadAll();
  ASSERT_EQ(loaded.modules.size(), 1u);
  EXPECT_TRUE(AllEqual(loaded.modules[0].root->GetStateDict(), 7));

  // A name with a file reserved (a load receiving) is not moved under it.
  absl::StatusOr<std::string> reserved =
      repository_->ReserveDataFile(Name("t/kept"));
  ASSERT_THAT(reserved.status(), IsOk());
  EXPECT_THAT(repository_->SetAside(
                  Name("t/kept"),
                  data_dir::SetAsidePath(dir_.string(), Name("t/kept"), "x")),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(fs::exists(Manifest("t/kept")));
  repository_->ReleaseDataFile(Name("t/kept"), *reserved);

  // A copy that cannot be moved stays where it is, neither served nor
  // written over by a build of its name.
  const fs::path blocked = dir_ / "not-a-directory";
  std::ofstream(blocked.string()) << "x";
  EXPECT_FALSE(
      store_->SetAside(Name("t/kept"), "r2", (blocked / "t" / "kept").string())
          .ok());
  EXPECT_TRUE(fs::exists(Manifest("t/kept")));
  EXPECT_THAT(store_->Snapshot(Name("t/kept"), {}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("could not be set aside")));
  EXPECT_THAT(Build("t/kept").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(Records("set_aside"), SizeIs(2));
}

// A byte of a data file's JSON header that is no longer UTF-8: the parse
// error quotes it, and the restore record must still be written (it used
// to throw from the JSON dump and abort the server at every start). The
// module is then DATA_LOSS, not "does not exist"; the others are served.
TEST_F(ModelStoreTest, ADamagedHeaderByteFailsOneModuleAtRestart) {
  MakeDurable();
  ASSERT_THAT(Build("t/bad").status(), IsOk());
  ASSERT_THAT(Build("t/good").status(), IsOk());
  for (const auto& f : fs::directory_iterator(
           data_dir::ModuleDir((dir_ / "modules").string(), Name("t/bad")))) {
    if (f.path().extension() != ".safetensors") continue;
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(10);  // inside the header's first key
    io.put('\xff');
  }
  ModelStore::RestoreReport report = Restart();
  EXPECT_EQ(report.modules, 1u);
  ASSERT_THAT(report.errors, SizeIs(1));
  EXPECT_THAT(report.errors[0],
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("\\xff")));
  ASSERT_THAT(Records("restore"), SizeIs(1));
  EXPECT_TRUE(nlohmann::json::accept(Records("restore")[0].details_json));
  EXPECT_THAT(store_->Snapshot(Name("t/bad"), {}).status(),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("'t/bad' is not served"),
                             HasSubstr("data-1.safetensors"))));
  EXPECT_THAT(store_->Snapshot(Name("t/good"), {}).status(), IsOk());
}

// The audit log keeps every record for good: a load with more unexpected
// keys than a record lists counts the rest.
TEST_F(ModelStoreTest, ALoadRecordListsAThousandKeysAndCountsTheRest) {
  MakeDurable();
  ASSERT_THAT(Build("t/m").status(), IsOk());
  StateDict state = State("t/m");
  for (int i = 0; i < 1500; ++i) {
    state.tensors.Set(absl::StrCat("extra.", i),
                      Filled(DType::kFloat32, {0}, 0));
  }
  LoadOptions lenient;
  lenient.strict = false;
  ASSERT_THAT(store_->Load(ctx_, Name("t/m"), state, lenient).status(), IsOk());
  ASSERT_THAT(Records("load_state_dict"), SizeIs(1));
  const nlohmann::json details =
      nlohmann::json::parse(Records("load_state_dict")[0].details_json);
  EXPECT_EQ(details["unexpected_keys"].size(), 1000u);
  EXPECT_EQ(details["unexpected_keys"][0], "extra.0");
  EXPECT_EQ(details["unexpected_keys_count"], 1500);
  EXPECT_FALSE(details.contains("missing_keys_count"));
}

TEST_F(ModelStoreTest, TheScrubChecksEveryMappedByteAndReportsDamageOnce) {
  MakeDurable();
  ASSERT_THAT(Build("t/a").status(), IsOk());
  ASSERT_THAT(Build("t/b").status(), IsOk());
  auto never = [] { return false; };
  // Nothing is mapped before a restart: built bytes are the process's own.
  ModelStore::ScrubReport report = store_->Scrub(never);
  EXPECT_EQ(report.modules, 2u);
  EXPECT_EQ(report.storages, 0u);
  ASSERT_EQ(Restart().modules, 2u);
  report = store_->Scrub(never);
  EXPECT_EQ(report.modules, 2u);
  EXPECT_EQ(report.storages, 4u);
  EXPECT_EQ(report.bytes, 2u * (12 + 3) * 4);
  EXPECT_THAT(report.damaged, IsEmpty());
  // Damage under the running store: the next pass finds it, names it, and
  // every read refuses it from then on; later passes report it again, as
  // not new.
  DamageDataFiles(dir_ / "modules", Name("t/b"), 2);
  report = store_->Scrub(never);
  ASSERT_THAT(report.damaged, SizeIs(1));
  EXPECT_EQ(report.newly_damaged, 1u);
  EXPECT_THAT(report.damaged[0],
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("'bias'"), HasSubstr("module 't/b'"))));
  absl::StatusOr<StateDictSnapshot> snapshot =
      store_->Snapshot(Name("t/b"), {});
  ASSERT_THAT(snapshot.status(), IsOk());
  absl::StatusOr<std::unique_ptr<StateDictReader>> reader =
      StateDictReader::Create(snapshot->state, std::nullopt);
  ASSERT_THAT(reader.status(), IsOk());
  std::string bytes;
  EXPECT_THAT((*reader)->Read(1 << 20, &bytes).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'bias'")));
  report = store_->Scrub(never);
  EXPECT_THAT(report.damaged, SizeIs(1));
  EXPECT_EQ(report.newly_damaged, 0u);
  // A load replaces the damaged bytes: nothing mapped is left of them.
  ASSERT_THAT(store_->Load(ctx_, Name("t/b"), Pattern(1.5f), {}).status(),
              IsOk());
  report = store_->Scrub(never);
  EXPECT_THAT(report.damaged, IsEmpty());
  EXPECT_EQ(report.storages, 2u);
  // A pass told to stop checks nothing more.
  EXPECT_EQ(store_->Scrub([] { return true; }).storages, 0u);
}

TEST_F(ModelStoreTest, AClusterMoveOfDamagedBytesIsRefusedByTheTarget) {
  MakeDurable();
  ASSERT_THAT(Build("t/m").status(), IsOk());
  DamageDataFiles(dir_ / "modules", Name("t/m"), 2);
  OtherReplica other(dir_ / "other");
  auto ok = [] { return absl::OkStatus(); };
  EXPECT_THAT(store_->MoveOut(ctx_, Name("t/m"), "there",
                              [&](const std::vector<std::string>& files) {
                                return SendTo(*other.store, Name("t/m"), files,
                                              ok);
                              }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("'s1'")));
  EXPECT_TRUE(store_->Contains(Name("t/m")));
  EXPECT_FALSE(other.store->Contains(Name("t/m")));
}

TEST_F(ModelStoreTest, AFailedClusterMoveLeavesTheModuleWhereItWas) {
  MakeDurable();
  ASSERT_THAT(Build("t/m").status(), IsOk());
  const StateDict before = State("t/m");
  OtherReplica other(dir_ / "other");
  const std::string other_dir =
      data_dir::ModuleDir((dir_ / "other" / "modules").string(), Name("t/m"));
  // The target could not take the ownership (etcd said no): nothing of
  // the import is left there, and the module stays here, writable.
  auto refused = [] {
    return absl::FailedPreconditionError("owned by someone else");
  };
  EXPECT_THAT(store_->MoveOut(ctx_, Name("t/m"), "there",
                              [&](const std::vector<std::string>& files) {
                                return SendTo(*other.store, Name("t/m"), files,
                                              refused);
                              }),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("owned by someone else")));
  EXPECT_FALSE(other.store->Contains(Name("t/m")));
  other.repository->WaitForDeletions();
  EXPECT_FALSE(fs::exists(other_dir) && !fs::is_empty(other_dir));
  ExpectSameState(State("t/m"), before);
  EXPECT_THAT(store_->SetTraining(ctx_, Name("t/m"), false), IsOk());
  ASSERT_THAT(Records("move_out"), SizeIs(1));
  EXPECT_EQ(Records("move_out")[0].outcome, "error");
  // A sender that fails before the target hears of it: the same.
  EXPECT_THAT(MoveOutCutOff("t/m"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(store_->Contains(Name("t/m")));
  // A target that hosts the name already refuses the files.
  BuildOptions no_hooks;
  no_hooks.hooks = nullptr;
  ASSERT_THAT(
      other.store
          ->Build(ctx_, Name("t/m"), SpecFromJson(kLinear), no_hooks, false)
          .status(),
      IsOk());
  EXPECT_THAT(other.store->ReserveImportFile(Name("t/m")).status(),
              StatusIs(absl::StatusCode::kAlreadyExists));
}

TEST_F(ModelStoreTest, AModuleImportChecksWhatItIsSentAndLeavesNothingBehind) {
  MakeDurable();
  ASSERT_THAT(Build("t/m").status(), IsOk());
  const StateDict before = State("t/m");
  OtherReplica other(dir_ / "other");
  ModelService service(other.store.get(), /*hub=*/nullptr, other.audit.get(),
                       /*auth=*/nullptr, ModelServiceOptions());
  Credentials credentials;
  credentials.peer = "ipv4:127.0.0.1:1";
  absl::StatusOr<Caller> caller = service.Authenticate(credentials, "Import");
  ASSERT_THAT(caller.status(), IsOk());
  const Caller admin = *caller;
  const ModuleName name = Name("t/m");
  auto begin = [&](std::vector<TransferFile> files) {
    return ModuleImport::Begin(service, admin, name, "here", std::move(files))
        .status();
  };
  EXPECT_THAT(begin({}), StatusIs(absl::StatusCode::kInvalidArgument,
                                  HasSubstr("manifest.json")));
  EXPECT_THAT(begin({{"manifest.json", 2}, {"data-1.safetensors", 8}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(begin({{"../../escape", 8}, {"manifest.json", 2}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("files[0].name: '../../escape'")));
  EXPECT_THAT(
      begin({{"data-1.safetensors", 8},
             {"data-1.safetensors", 8},
             {"manifest.json", 2}}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("repeats")));
  EXPECT_THAT(begin({{"manifest.json", ModuleImport::kMaxManifestBytes + 1}}),
              StatusIs(absl::StatusCode::kResourceExhausted));
  const std::string other_dir =
      data_dir::ModuleDir((dir_ / "other" / "modules").string(), name);
  auto nothing_left = [&] {
    other.repository->WaitForDeletions();
    return !fs::exists(other_dir) || fs::is_empty(other_dir);
  };
  // The module's real files, sent whole, short, or with bytes to spare.
  const std::vector<std::string> paths = *repository_->CommittedFiles(name);
  ASSERT_GE(paths.size(), 2u);
  const std::vector<TransferFile> files = *DescribeTransferFiles(paths);
  auto send = [&](std::function<absl::string_view(const std::string&)> cut)
      -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(
        std::unique_ptr<ModuleImport> import,
        ModuleImport::Begin(service, admin, name, "here", files));
    absl::Status appended;
    MODELSTATE_RETURN_IF_ERROR(
        ReadTransferFiles(paths, 1000, [&](std::string& chunk) {
          appended = import->Append(cut(chunk));
          return appended.ok();
        }));
    MODELSTATE_RETURN_IF_ERROR(appended);
    return import->Commit([] { return absl::OkStatus(); });
  };
  EXPECT_THAT(send([](const std::string& chunk) {
                return absl::string_view(chunk).substr(0, chunk.size() / 2);
              }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the stream ended inside file")));
  EXPECT_TRUE(nothing_left());
  std::string doubled;
  EXPECT_THAT(send([&](const std::string& chunk) {
                doubled = chunk + chunk;
                return absl::string_view(doubled);
              }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("more bytes than the files listed hold")));
  EXPECT_TRUE(nothing_left());
  EXPECT_FALSE(other.store->Contains(name));
  ASSERT_THAT(
      send([](const std::string& chunk) { return absl::string_view(chunk); }),
      IsOk());
  absl::StatusOr<StateDictSnapshot> moved = other.store->Snapshot(name, {});
  ASSERT_THAT(moved.status(), IsOk());
  ExpectSameState(moved->state, before);
}

}  // namespace
}  // namespace modelstate

// Registration hooks (SEMANTICS H1-H6): chain order, keep / replace / block,
// unregistration events, replacement validation, handles, thread safety, and
// deferred (remote) decisions applied with ApplyFinalDecisions.
#include "core/hooks.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "core/module.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nn/module_spec.h"
#include "tests/testing/spec_json.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace modelstate {
namespace {

using ::modelstate::testing::IsOk;
using ::modelstate::testing::SpecFromJson;
using ::modelstate::testing::StatusIs;
using ::modelstate::testing::Zeros;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

Tensor Param(Shape shape, DType dtype = DType::kFloat32) {
  return *MakeParameter(Zeros(std::move(shape), dtype));
}

RegistrationContext With(const HookRegistry& hooks) {
  RegistrationContext ctx;
  ctx.hooks = &hooks;
  return ctx;
}

TEST(HookRegistryTest, HooksOfOneKindRunInRegistrationOrderAndChain) {
  HookRegistry hooks;
  std::vector<std::string> calls;
  RemovableHandle h1 = hooks.AddParameterHook([&](const RegistrationEvent& e) {
    calls.push_back("first:" + std::string(DTypeName(e.value.tensor.dtype())));
    return HookResult::Replace(
        *e.value.tensor.To(Device::Cpu(), DType::kFloat64));
  });
  RemovableHandle h2 = hooks.AddParameterHook([&](const RegistrationEvent& e) {
    // Sees the first hook's replacement.
    calls.push_back("second:" + std::string(DTypeName(e.value.tensor.dtype())));
    return HookResult::Keep();
  });
  RemovableHandle buffer_hook =
      hooks.AddBufferHook([&](const RegistrationEvent&) {
        calls.push_back("buffer");
        return HookResult::Keep();
      });
  std::shared_ptr<Module> m = Module::Create("M");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      RegistrationOutcome o,
      m->RegisterParameter("w", Param({2}), With(hooks)));
  EXPECT_THAT(calls, ElementsAre("first:float32", "second:float64"));
  EXPECT_EQ(o.decision.kind, HookResult::Kind::kReplace);
  const Tensor& stored = *m->parameters().Find("w");
  EXPECT_EQ(stored.dtype(), DType::kFloat64);
  EXPECT_TRUE(stored.is_parameter());
  EXPECT_TRUE(stored.requires_grad());
  EXPECT_LT(h1.id(), h2.id());
  EXPECT_LT(h2.id(), buffer_hook.id());
}

TEST(HookRegistryTest, KeepRegistersTheValueUnchanged) {
  HookRegistry hooks;
  int calls = 0;
  RemovableHandle h = hooks.AddBufferHook([&](const RegistrationEvent&) {
    ++calls;  // A logging hook returns nothing: keep (never block).
    return HookResult::Keep();
  });
  std::shared_ptr<Module> m = Module::Create("M");
  Tensor t = Zeros({3});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(RegistrationOutcome o,
                                  m->RegisterBuffer("b", t, true, With(hooks)));
  EXPECT_EQ(o.decision.kind, HookResult::Kind::kKeep);
  EXPECT_TRUE(m->buffers().Find("b")->is_same(t));
  EXPECT_EQ(calls, 1);
}

TEST(HookRegistryTest, BlockStopsTheChainAndKeepsThePreviousValue) {
  HookRegistry hooks;
  int later_calls = 0;
  RemovableHandle h1 = hooks.AddBufferHook([](const RegistrationEvent& e) {
    if (e.name == "temp_buffer") return HookResult::Block("no temp buffers");
    return HookResult::Keep();
  });
  RemovableHandle h2 = hooks.AddBufferHook([&](const RegistrationEvent&) {
    ++later_calls;
    return HookResult::Keep();
  });
  std::shared_ptr<Module> m = Module::Create("M");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      RegistrationOutcome o,
      m->RegisterBuffer("temp_buffer", Zeros({1}), true, With(hooks)));
  EXPECT_TRUE(o.decision.blocked());
  EXPECT_EQ(o.decision.reason, "no temp buffers");
  EXPECT_FALSE(m->buffers().Contains("temp_buffer"));
  EXPECT_EQ(later_calls, 0);

  // Blocking an overwrite keeps the old value in place.
  Tensor old = Zeros({1});
  ASSERT_THAT(m->RegisterBuffer("kept", old), IsOk());
  RemovableHandle h3 = hooks.AddBufferHook([](const RegistrationEvent& e) {
    return e.name == "kept" ? HookResult::Block() : HookResult::Keep();
  });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      o, m->RegisterBuffer("kept", Zeros({2}), true, With(hooks)));
  EXPECT_TRUE(o.decision.blocked());
  EXPECT_THAT(o.decision.reason, HasSubstr("blocked by hook"));
  EXPECT_TRUE(m->buffers().Find("kept")->is_same(old));
}

TEST(HookRegistryTest, UnregistrationIsAnEventWithANullValue) {
  HookRegistry hooks;
  std::vector<std::string> seen;
  auto record = [&](const RegistrationEvent& e) {
    seen.push_back(std::string(EntryKindName(e.kind)) + ":" + e.name + ":" +
                   std::string(RegistrationActionName(e.action)) +
                   (e.value.is_null() ? ":null" : ":value"));
    return HookResult::Keep();
  };
  RemovableHandle hp = hooks.AddParameterHook(record);
  RemovableHandle hb = hooks.AddBufferHook(record);
  RemovableHandle hm = hooks.AddModuleHook(record);
  std::shared_ptr<Module> m = Module::Create("M");
  RegistrationContext ctx = With(hooks);
  ASSERT_THAT(m->RegisterParameter("p", Tensor(), ctx), IsOk());
  ASSERT_THAT(m->RegisterBuffer("b", Zeros({1}), true, ctx), IsOk());
  ASSERT_THAT(m->RegisterBuffer("b", Tensor(), true, ctx), IsOk());
  ASSERT_THAT(m->RegisterModule("c", Module::Create("C"), ctx), IsOk());
  ASSERT_THAT(m->RemoveEntry("c", ctx), IsOk());
  EXPECT_THAT(
      seen, ElementsAre("parameter:p:unregister:null",
                        "buffer:b:register:value", "buffer:b:unregister:null",
                        "module:c:register:value", "module:c:unregister:null"));
  // Registering None keeps the slot (as None); removal deletes it.
  EXPECT_TRUE(m->parameters().Contains("p"));
  EXPECT_FALSE(m->parameters().Find("p")->defined());
  EXPECT_TRUE(m->buffers().Contains("b"));
  EXPECT_FALSE(m->children().Contains("c"));
}

TEST(HookRegistryTest, BlockedUnregistrationKeepsTheEntry) {
  HookRegistry hooks;
  RemovableHandle h = hooks.AddModuleHook([](const RegistrationEvent& e) {
    return e.action == RegistrationAction::kUnregister
               ? HookResult::Block("frozen")
               : HookResult::Keep();
  });
  std::shared_ptr<Module> m = Module::Create("M");
  std::shared_ptr<Module> child = Module::Create("C");
  ASSERT_THAT(m->RegisterModule("c", child, With(hooks)), IsOk());
  MODELSTATE_ASSERT_OK_AND_ASSIGN(RegistrationOutcome o,
                                  m->RemoveEntry("c", With(hooks)));
  EXPECT_TRUE(o.decision.blocked());
  EXPECT_EQ(*m->children().Find("c"), child);
  MODELSTATE_ASSERT_OK_AND_ASSIGN(o,
                                  m->RegisterModule("c", nullptr, With(hooks)));
  EXPECT_TRUE(o.decision.blocked());
  EXPECT_EQ(*m->children().Find("c"), child);
}

TEST(HookRegistryTest, InvalidReplacementsBlockWithAReason) {
  HookRegistry hooks;
  Tensor replacement;
  RemovableHandle h = hooks.AddParameterHook([&](const RegistrationEvent&) {
    return HookResult::Replace(replacement);
  });
  BuildOptions options;
  options.hooks = nullptr;
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      BuildResult built,
      BuildModule(SpecFromJson(R"({"type": "Linear", "args": [3, 2]})"),
                  options));
  std::shared_ptr<Module> linear = built.root;
  struct Case {
    const char* what;
    Tensor value;
    const char* reason;
  };
  std::vector<Case> cases = {
      {"wrong shape in a built-in layer", Zeros({3, 3}),
       "shape must stay [2, 3]"},
      {"integer dtype", Zeros({2, 3}, DType::kInt32),
       "may only become another floating point dtype"},
      {"no tensor", Tensor(), "can only be replaced by a tensor"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    replacement = c.value;
    Tensor before = *linear->parameters().Find("weight");
    MODELSTATE_ASSERT_OK_AND_ASSIGN(
        RegistrationOutcome o,
        linear->RegisterParameter("weight", Param({2, 3}), With(hooks)));
    EXPECT_TRUE(o.decision.blocked());
    EXPECT_THAT(o.decision.reason, HasSubstr("invalid replacement"));
    EXPECT_THAT(o.decision.reason, HasSubstr(c.reason));
    EXPECT_TRUE(linear->parameters().Find("weight")->is_same(before));
  }
  // A custom module accepts any shape.
  std::shared_ptr<Module> custom = Module::Create("Custom");
  replacement = Zeros({7});
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      RegistrationOutcome o,
      custom->RegisterParameter("w", Param({2}), With(hooks)));
  EXPECT_EQ(o.decision.kind, HookResult::Kind::kReplace);
  EXPECT_EQ(custom->parameters().Find("w")->shape(), Shape{7});
  // A plain tensor replacement becomes a parameter keeping requires_grad.
  EXPECT_TRUE(custom->parameters().Find("w")->is_parameter());
  EXPECT_TRUE(custom->parameters().Find("w")->requires_grad());
}

TEST(HookRegistryTest, ReplacementIsInvalidOnUnregister) {
  HookRegistry hooks;
  RemovableHandle h = hooks.AddBufferHook([](const RegistrationEvent&) {
    return HookResult::Replace(*Tensor::Zeros(DType::kFloat32, {1}));
  });
  std::shared_ptr<Module> m = Module::Create("M");
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      RegistrationOutcome o,
      m->RegisterBuffer("b", Tensor(), true, With(hooks)));
  EXPECT_TRUE(o.decision.blocked());
  EXPECT_THAT(o.decision.reason,
              HasSubstr("not allowed for an unregister event"));
  EXPECT_FALSE(m->buffers().Contains("b"));
}

TEST(HookRegistryTest, ModuleReplacementMayNotCreateACycle) {
  HookRegistry hooks;
  std::shared_ptr<Module> parent = Module::Create("Parent");
  RemovableHandle h = hooks.AddModuleHook(
      [&](const RegistrationEvent&) { return HookResult::Replace(parent); });
  MODELSTATE_ASSERT_OK_AND_ASSIGN(
      RegistrationOutcome o,
      parent->RegisterModule("child", Module::Create("Child"), With(hooks)));
  EXPECT_TRUE(o.decision.blocked());
  EXPECT_THAT(o.decision.reason, HasSubstr("inside itself"));
}

TEST(HookRegistryTest, BufferReplacementMayChangePersistence) {
  HookRegistry hooks;
  RemovableHandle h = hooks.AddBufferHook([](const RegistrationEvent& e) {
    return HookResult::ReplaceBuffer(e.value.tensor, /*persistent=*/false);
  });
  std::shared_ptr<Module> m = Module::Create("M");
  ASSERT_THAT(m->RegisterBuffer("b", Zeros({1}), true, With(hooks)), IsOk());
  EXPECT_FALSE(m->IsPersistentBuffer("b"));
  EXPECT_TRUE(m->GetStateDict().tensors.empty());
}

TEST(RemovableHandleTest, RemoveIsIdempotentAndSafeDuringARun) {
  HookRegistry hooks;
  int first_calls = 0;
  int second_calls = 0;
  RemovableHandle second;
  RemovableHandle first = hooks.AddBufferHook([&](const RegistrationEvent&) {
    ++first_calls;
    second.Remove();  // Removing a hook while the chain runs is safe.
    return HookResult::Keep();
  });
  second = hooks.AddBufferHook([&](const RegistrationEvent&) {
    ++second_calls;
    return HookResult::Keep();
  });
  std::shared_ptr<Module> m = Module::Create("M");
  ASSERT_THAT(m->RegisterBuffer("a", Zeros({1}), true, With(hooks)), IsOk());
  // The running chain used the hooks present when it started.
  EXPECT_EQ(second_calls, 1);
  ASSERT_THAT(m->RegisterBuffer("b", Zeros({1}), true, With(hooks)), IsOk());
  EXPECT_EQ(second_calls, 1);
  EXPECT_EQ(first_calls, 2);
  second.Remove();
  first.Remove();
  first.Remove();
  EXPECT_EQ(hooks.HookCount(EntryKind::kBuffer), 0u);
}

TEST(RemovableHandleTest, OutlivingTheRegistryIsHarmless) {
  RemovableHandle h;
  {
    HookRegistry hooks;
    h = hooks.AddModuleHook(
        [](const RegistrationEvent&) { return HookResult::Keep(); });
  }
  h.Remove();
}

TEST(HookRegistryTest, GlobalHooksApplyToPlainRegistrations) {
  int calls = 0;
  RemovableHandle h =
      HookRegistry::Global().AddParameterHook([&](const RegistrationEvent& e) {
        if (e.name == "frozen_by_global") ++calls;
        return HookResult::Keep();
      });
  std::shared_ptr<Module> m = Module::Create("M");
  ASSERT_THAT(m->RegisterParameter("frozen_by_global", Param({1})), IsOk());
  h.Remove();
  ASSERT_THAT(m->RegisterParameter("frozen_by_global", Param({1})), IsOk());
  EXPECT_EQ(calls, 1);
}

TEST(HookRegistryTest, ConcurrentRegistrationWhileHooksComeAndGo) {
  HookRegistry hooks;
  std::atomic<int64_t> runs{0};
  RemovableHandle counting =
      hooks.AddParameterHook([&](const RegistrationEvent&) {
        runs.fetch_add(1);
        return HookResult::Keep();
      });
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  std::vector<std::thread> threads;
  std::atomic<bool> stop{false};
  // One thread keeps adding and removing a blocking hook for another name.
  std::thread churn([&] {
    while (!stop.load()) {
      RemovableHandle h =
          hooks.AddParameterHook([](const RegistrationEvent& e) {
            return e.name == "never" ? HookResult::Block() : HookResult::Keep();
          });
      h.Remove();
    }
  });
  std::vector<std::shared_ptr<Module>> modules;
  for (int t = 0; t < kThreads; ++t) modules.push_back(Module::Create("M"));
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        absl::StatusOr<RegistrationOutcome> o = modules[t]->RegisterParameter(
            "p" + std::to_string(i), Param({1}), With(hooks));
        ASSERT_TRUE(o.ok());
        ASSERT_FALSE(o->decision.blocked());
      }
    });
  }
  for (std::thread& th : threads) th.join();
  stop.store(true);
  churn.join();
  EXPECT_EQ(runs.load(), kThreads * kPerThread);
  for (const auto& m : modules)
    EXPECT_EQ(m->parameters().size(), size_t{kPerThread});
}

// ---------------------------------------------------------------------------
// Deferred decisions: a build records every registration; decisions taken
// later (by remote subscribers) are applied as if taken at the time.

BuildResult BuildRecorded(const std::string& json) {
  BuildOptions o;
  o.hooks = nullptr;
  absl::StatusOr<BuildResult> r = BuildModule(SpecFromJson(json), o);
  EXPECT_TRUE(r.ok()) << r.status();
  return *std::move(r);
}

TEST(ApplyFinalDecisionsTest, BlockReplaceAndKeepMatchOneAtATimeResults) {
  const std::string spec = R"({"type": "Net", "members": [
      {"module": {"name": "fc", "spec": {"type": "Linear", "args": [2, 3]}}},
      {"buffer": {"name": "temp_buffer", "shape": [1]}},
      {"parameter": {"name": "_scale", "shape": [1], "init": {"kind": "ones"}}}]})";
  BuildResult built = BuildRecorded(spec);
  ASSERT_EQ(built.records.size(),
            5u);  // fc.weight, fc.bias, fc, temp_buffer, _scale
  std::vector<HookDecision> finals;
  for (const RegistrationRecord& r : built.records) finals.push_back(r.local);
  // Block fc.bias, replace _scale, block temp_buffer.
  finals[1].kind = HookResult::Kind::kBlock;
  finals[3].kind = HookResult::Kind::kBlock;
  Tensor doubled = *Tensor::Full(DType::kFloat64, {1}, 2.0);
  finals[4].kind = HookResult::Kind::kReplace;
  finals[4].value.tensor = *MakeParameter(doubled, false);
  MODELSTATE_ASSERT_OK(ApplyFinalDecisions(built.records, finals));
  EXPECT_THAT(built.root->GetStateDict().tensors.Keys(),
              ElementsAre("_scale", "fc.weight"));
  const Tensor& scale = *built.root->parameters().Find("_scale");
  EXPECT_EQ(scale.dtype(), DType::kFloat64);
  EXPECT_FALSE(scale.requires_grad());
}

TEST(ApplyFinalDecisionsTest, BlockedRemovalRestoresThePosition) {
  std::shared_ptr<Module> m = Module::Create("M");
  for (const char* n : {"a", "b", "c"}) {
    ASSERT_THAT(m->RegisterParameter(n, Param({1})), IsOk());
  }
  std::vector<RegistrationRecord> records;
  RegistrationContext ctx;
  ctx.hooks = nullptr;
  ctx.records = &records;
  ASSERT_THAT(m->RemoveEntry("a", ctx), IsOk());
  EXPECT_THAT(m->parameters().Keys(), ElementsAre("b", "c"));
  std::vector<HookDecision> finals = {records[0].local};
  finals[0].kind = HookResult::Kind::kBlock;
  MODELSTATE_ASSERT_OK(ApplyFinalDecisions(records, finals));
  EXPECT_THAT(m->parameters().Keys(), ElementsAre("a", "b", "c"));
}

TEST(ApplyFinalDecisionsTest, BlockingOneOfTwoWritesToASlotKeepsTheOther) {
  std::shared_ptr<Module> m = Module::Create("M");
  Tensor first = Param({1});
  Tensor second = Param({2});
  std::vector<RegistrationRecord> records;
  RegistrationContext ctx;
  ctx.hooks = nullptr;
  ctx.records = &records;
  ASSERT_THAT(m->RegisterParameter("w", first, ctx), IsOk());
  ASSERT_THAT(m->RegisterParameter("w", second, ctx), IsOk());
  std::vector<HookDecision> finals = {records[0].local, records[1].local};
  finals[1].kind = HookResult::Kind::kBlock;
  MODELSTATE_ASSERT_OK(ApplyFinalDecisions(records, finals));
  EXPECT_TRUE(m->parameters().Find("w")->is_same(first));
  EXPECT_THAT(ApplyFinalDecisions(records, {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace modelstate

namespace modelstate {
namespace {

TEST(ModuleToTest, ConvertsInPlaceYetSnapshotsKeepTheirBytes) {
  BuildOptions o;
  o.hooks = nullptr;
  auto built = BuildModule(SpecFromJson(R"({"type": "Sequential", "children": [
          {"spec": {"type": "Linear", "args": [600, 600]}},
          {"spec": {"type": "BatchNorm1d", "args": [600]}}]})"),
                           o);
  ASSERT_TRUE(built.ok());
  std::shared_ptr<Module> m = built->root;
  const Tensor& weight =
      *(*m->children().Find("0"))->parameters().Find("weight");
  const void* weight_bytes = weight.raw_data();
  StateDict before = m->GetStateDict();  // shares every storage
  StateDict copy;
  for (const auto& item : before.tensors) {
    copy.tensors.Set(item.key, *item.value.Clone());
  }
  ASSERT_THAT(m->To(std::nullopt, DType::kFloat16), IsOk());
  // The snapshot still holds float32 bytes (the shared storages were
  // converted into new ones)...
  for (const auto& item : before.tensors) {
    EXPECT_TRUE(TensorsEqual(item.value, *copy.tensors.Find(item.key)))
        << item.key;
  }
  EXPECT_NE(weight.raw_data(), weight_bytes);
  // ...and without a snapshot, the conversion reuses each storage.
  before = StateDict();
  copy = StateDict();
  ASSERT_THAT(m->To(std::nullopt, DType::kBFloat16), IsOk());
  const void* bf16_bytes = weight.raw_data();
  ASSERT_THAT(m->To(std::nullopt, DType::kFloat16), IsOk());
  EXPECT_EQ(weight.raw_data(), bf16_bytes);
  EXPECT_EQ(weight.dtype(), DType::kFloat16);
}

}  // namespace
}  // namespace modelstate

#include "service/module_repository.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "core/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "nn/module_spec.h"
#include "tests/testing/golden_models.h"
#include "tests/testing/layer_examples.h"
#include "tests/testing/spec_json.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tensors.h"

namespace modelstate {
namespace {

namespace fs = std::filesystem;
using ::modelstate::testing::ExpectSameState;
using ::modelstate::testing::Filled;
using ::modelstate::testing::GoldenModelSpecs;
using ::modelstate::testing::IsOk;
using ::modelstate::testing::LayerExampleJson;
using ::modelstate::testing::SpecFromJson;
using ::modelstate::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

std::shared_ptr<Module> Build(const std::string& json, uint64_t seed = 3) {
  BuildOptions options;
  options.seed = seed;
  options.hooks = nullptr;
  absl::StatusOr<BuildResult> built = BuildModule(SpecFromJson(json), options);
  EXPECT_TRUE(built.ok()) << built.status();
  return built.ok() ? built->root : nullptr;
}

ModuleName Name(const std::string& text) { return *ParseModuleName(text); }

ChangeNote Note(const std::string& type, const std::string& request = "r1") {
  return ChangeNote{type, "tester", request, 7};
}

bool SameDouble(double a, double b) {
  return std::isnan(a) ? std::isnan(b)
                       : a == b && std::signbit(a) == std::signbit(b);
}

bool SameAttr(const AttrValue& a, const AttrValue& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        const T& y = std::get<T>(b);
        if constexpr (std::is_same_v<T, double>) {
          return SameDouble(x, y);
        } else if constexpr (std::is_same_v<T, Tensor>) {
          return TensorsEqual(x, y);
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          return std::equal(x.begin(), x.end(), y.begin(), y.end(), SameDouble);
        } else {
          return x == y;
        }
      },
      a);
}

// Checks that two trees are the same in everything a module holds, and that
// sharing matches: a module or tensor object shared in one is shared at the
// same places in the other.
class TreeComparer {
 public:
  void Compare(const Module& a, const Module& b, const std::string& path) {
    SCOPED_TRACE(path.empty() ? "<root>" : path);
    auto [it, added] = modules_.try_emplace(&a, &b);
    EXPECT_EQ(it->second, &b) << "module sharing differs";
    if (!added) return;
    EXPECT_EQ(a.type_name(), b.type_name());
    EXPECT_EQ(a.qualified_name(), b.qualified_name());
    EXPECT_EQ(a.version(), b.version());
    EXPECT_EQ(a.fixed_shapes(), b.fixed_shapes());
    EXPECT_EQ(a.is_training(), b.is_training());
    EXPECT_EQ(a.fills_num_batches_tracked(), b.fills_num_batches_tracked());
    EXPECT_EQ(a.ClassAttributeNames(), b.ClassAttributeNames());
    EXPECT_EQ(a.has_extra_state(), b.has_extra_state());
    CompareTensor(a.extra_state(), b.extra_state(), "_extra_state");
    EXPECT_EQ(a.parameters().Keys(), b.parameters().Keys());
    for (const auto& item : a.parameters()) {
      CompareTensor(item.value, *b.parameters().Find(item.key), item.key);
    }
    EXPECT_EQ(a.buffers().Keys(), b.buffers().Keys());
    for (const auto& item : a.buffers()) {
      CompareTensor(item.value, *b.buffers().Find(item.key), item.key);
      EXPECT_EQ(a.IsPersistentBuffer(item.key), b.IsPersistentBuffer(item.key))
          << item.key;
    }
    EXPECT_EQ(a.attributes().Keys(), b.attributes().Keys());
    for (const auto& item : a.attributes()) {
      const AttrValue* other = b.attributes().Find(item.key);
      ASSERT_NE(other, nullptr) << item.key;
      EXPECT_TRUE(SameAttr(item.value, *other)) << item.key;
    }
    ASSERT_EQ(a.children().Keys(), b.children().Keys());
    for (const auto& item : a.children()) {
      const std::shared_ptr<Module>& other = *b.children().Find(item.key);
      ASSERT_EQ(item.value == nullptr, other == nullptr) << item.key;
      if (item.value != nullptr) {
        Compare(*item.value, *other,
                path.empty() ? item.key : absl::StrCat(path, ".", item.key));
      }
    }
  }

 private:
  void CompareTensor(const Tensor& a, const Tensor& b, const std::string& key) {
    ASSERT_EQ(a.defined(), b.defined()) << key;
    if (!a.defined()) return;
    auto [it, added] = tensors_.try_emplace(a.identity(), b.identity());
    EXPECT_EQ(it->second, b.identity()) << key << ": tensor sharing differs";
    EXPECT_EQ(a.is_parameter(), b.is_parameter()) << key;
    EXPECT_EQ(a.requires_grad(), b.requires_grad()) << key;
    EXPECT_EQ(a.device(), b.device()) << key;
    EXPECT_TRUE(TensorsEqual(a, b))
        << key << ": " << a.DebugString() << " vs " << b.DebugString();
  }

  absl::flat_hash_map<const Module*, const Module*> modules_;
  absl::flat_hash_map<const void*, const void*> tensors_;
};

void ExpectSameTree(const Module& a, const Module& b) {
  TreeComparer().Compare(a, b, "");
}

class ModuleRepositoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat(
               "repo_", getpid(), "_",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    repo_ = Open();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<ModuleRepository> Open() {
    absl::StatusOr<std::unique_ptr<ModuleRepository>> repo =
        ModuleRepository::Open(dir_.string());
    EXPECT_TRUE(repo.ok()) << repo.status();
    return repo.ok() ? std::move(*repo) : nullptr;
  }

  // What a restarted server would find.
  ModuleRepository::LoadReport Reload() {
    repo_ = Open();
    return repo_->LoadAll();
  }

  fs::path ModuleDir(const std::string& name) const {
    ModuleName n = Name(name);
    return dir_ / n.ns / n.name;
  }
  // The module's data files once queued deletions are done.
  std::vector<std::string> DataFiles(const std::string& name) const {
    repo_->WaitForDeletions();
    std::vector<std::string> files;
    for (const auto& item : fs::directory_iterator(ModuleDir(name))) {
      std::string file = item.path().filename().string();
      if (file.rfind("data-", 0) == 0) files.push_back(file);
    }
    std::sort(files.begin(), files.end());
    return files;
  }

  // The shapes of the entries in one of the module's data files, in order;
  // empty (and a test failure) if the file cannot be read.
  std::vector<Shape> FileShapes(const std::string& name,
                                const std::string& file) const {
    absl::StatusOr<SafetensorsHeader> header =
        ReadSafetensorsHeader((ModuleDir(name) / file).string());
    EXPECT_THAT(header, IsOk());
    std::vector<Shape> shapes;
    if (header.ok()) {
      for (const SafetensorsEntry& e : header->entries)
        shapes.push_back(e.shape);
    }
    return shapes;
  }

  fs::path dir_;
  std::unique_ptr<ModuleRepository> repo_;
};

const ModuleRepository::Loaded* FindLoaded(
    const ModuleRepository::LoadReport& report, const std::string& name) {
  for (const auto& loaded : report.modules) {
    if (loaded.name.full() == name) return &loaded;
  }
  return nullptr;
}

TEST_F(ModuleRepositoryTest, EveryGoldenModelAndLayerComesBackExactly) {
  std::map<std::string, std::shared_ptr<Module>> saved;
  for (const auto& [case_name, json] : GoldenModelSpecs()) {
    saved["golden/" + case_name] = Build(json);
  }
  for (const std::string& type : LayerTypes()) {
    saved["layers/" + type] = Build(LayerExampleJson(type));
  }
  for (const auto& [name, root] : saved) {
    ASSERT_NE(root, nullptr) << name;
    ASSERT_THAT(repo_->Save(Name(name), *root, Note("build", name)), IsOk());
  }
  ModuleRepository::LoadReport report = Reload();
  EXPECT_THAT(report.errors, IsEmpty());
  ASSERT_EQ(report.modules.size(), saved.size());
  for (const auto& [name, root] : saved) {
    SCOPED_TRACE(name);
    const ModuleRepository::Loaded* loaded = FindLoaded(report, name);
    ASSERT_NE(loaded, nullptr);
    ExpectSameTree(*root, *loaded->root);
    ExpectSameState(loaded->root->GetStateDict(), root->GetStateDict());
    EXPECT_EQ(loaded->note.type, "build");
    EXPECT_EQ(loaded->note.correlation_id, name);
    EXPECT_EQ(loaded->note.identity, "tester");
    EXPECT_EQ(loaded->note.audit_seq, 7u);
  }
}

TEST_F(ModuleRepositoryTest, TiesSharedModulesNoneEntriesAndAttributesSurvive) {
  std::shared_ptr<Module> root = Module::Create("Odd");
  std::shared_ptr<Module> shared =
      Build(R"({"type": "Linear", "args": [2, 3]})");
  ASSERT_THAT(root->RegisterModule("a", shared), IsOk());
  ASSERT_THAT(root->RegisterModule("b", shared), IsOk());
  ASSERT_THAT(root->RegisterModule("gone", nullptr), IsOk());
  Tensor tied = *MakeParameter(Filled(DType::kFloat32, {3, 2}, 1.5), false);
  ASSERT_THAT(root->RegisterParameter("tied1", tied), IsOk());
  ASSERT_THAT(root->RegisterParameter("tied2", tied), IsOk());
  ASSERT_THAT(root->RegisterParameter("none", Tensor()), IsOk());
  Tensor counts = Filled(DType::kInt64, {4}, 9);
  ASSERT_THAT(root->RegisterBuffer("counts", counts, /*persistent=*/false),
              IsOk());
  // A buffer that is the same tensor object as a parameter elsewhere.
  ASSERT_THAT(root->RegisterBuffer("alias", tied), IsOk());
  ASSERT_THAT(root->RegisterBuffer("nobuf", Tensor(), false), IsOk());
  Tensor meta = *Tensor::Empty(DType::kBFloat16, {1000, 1000}, Device::Meta());
  ASSERT_THAT(root->RegisterBuffer("meta", meta), IsOk());
  root->SetPlainAttribute("nan", std::numeric_limits<double>::quiet_NaN());
  root->SetPlainAttribute("inf", -std::numeric_limits<double>::infinity());
  root->SetPlainAttribute("negzero", -0.0);
  root->SetPlainAttribute("third", 1.0 / 3.0);
  root->SetPlainAttribute("int", int64_t{1} << 60);
  root->SetPlainAttribute("flag", false);
  root->SetPlainAttribute("text", std::string("ünïcode \"quoted\"\n"));
  root->SetPlainAttribute("nothing", std::monostate());
  root->SetPlainAttribute("ints", std::vector<int64_t>{-1, 0, 7});
  root->SetPlainAttribute("floats", std::vector<double>{0.1, INFINITY});
  root->SetPlainAttribute("tensor", Filled(DType::kFloat16, {2}, 0.25));
  root->AddClassAttributes({"custom_method"});
  root->Train(false);
  shared->set_training(true);  // a child that differs from its parent
  ASSERT_THAT(repo_->Save(Name("t/odd"), *root, Note("register")), IsOk());

  ModuleRepository::LoadReport report = Reload();
  ASSERT_THAT(report.errors, IsEmpty());
  ASSERT_THAT(report.modules, SizeIs(1));
  const Module& back = *report.modules[0].root;
  ExpectSameTree(*root, back);
  EXPECT_EQ(*back.children().Find("a"), *back.children().Find("b"));
  EXPECT_TRUE(back.parameters().Find("tied1")->is_same(
      *back.parameters().Find("tied2")));
  EXPECT_TRUE(
      back.buffers().Find("alias")->is_same(*back.parameters().Find("tied1")));
  EXPECT_FALSE(back.parameters().Find("tied1")->requires_grad());
  EXPECT_FALSE(back.IsPersistentBuffer("counts"));
  EXPECT_TRUE(back.buffers().Find("meta")->device().is_meta());
  EXPECT_FALSE(back.is_training());
  EXPECT_TRUE((*back.children().Find("a"))->is_training());
  EXPECT_TRUE(back.HasClassAttribute("custom_method"));
  // Only the real bytes were stored: the 2 MB meta buffer has none.
  uint64_t on_disk = 0;
  for (const std::string& f : DataFiles("t/odd")) {
    on_disk += fs::file_size(ModuleDir("t/odd") / f);
  }
  EXPECT_LT(on_disk, 4096u);
}

TEST_F(ModuleRepositoryTest, SavesOnlyWhatChangedAndDeletesUnusedFiles) {
  std::shared_ptr<Module> m = Build(R"({"type": "Sequential", "children": [
      {"spec": {"type": "Linear", "args": [64, 64]}},
      {"spec": {"type": "Linear", "args": [64, 64]}}]})");
  const ModuleName name = Name("inc/m");
  ASSERT_THAT(repo_->Save(name, *m, Note("build")), IsOk());
  ASSERT_THAT(DataFiles("inc/m"), ElementsAre("data-1.safetensors"));

  // A load that changes one tensor writes that tensor only.
  StateDict change;
  change.tensors.Set("1.bias", Filled(DType::kFloat32, {64}, 2.0));
  ASSERT_THAT(m->LoadStateDict(change, {.strict = false}), IsOk());
  ASSERT_THAT(repo_->Save(name, *m, Note("load_state_dict")), IsOk());
  ASSERT_THAT(DataFiles("inc/m"),
              ElementsAre("data-1.safetensors", "data-2.safetensors"));
  EXPECT_THAT(FileShapes("inc/m", "data-2.safetensors"),
              ElementsAre(ElementsAre(64)));

  // Saving an unchanged tree writes no data at all.
  ASSERT_THAT(repo_->Save(name, *m, Note("set_training")), IsOk());
  EXPECT_THAT(DataFiles("inc/m"), SizeIs(2));

  // to(float16) replaces every storage: the old files go.
  ASSERT_THAT(m->To(std::nullopt, DType::kFloat16), IsOk());
  ASSERT_THAT(repo_->Save(name, *m, Note("move")), IsOk());
  EXPECT_THAT(DataFiles("inc/m"), ElementsAre("data-3.safetensors"));

  ModuleRepository::LoadReport report = Reload();
  ASSERT_THAT(report.errors, IsEmpty());
  ASSERT_THAT(report.modules, SizeIs(1));
  ExpectSameTree(*m, *report.modules[0].root);
  EXPECT_EQ(report.modules[0].note.type, "move");
}

TEST_F(ModuleRepositoryTest, APrewriteIsAdoptedExceptWhatChangedAfterIt) {
  std::shared_ptr<Module> m = Build(R"({"type": "Sequential", "children": [
      {"spec": {"type": "Linear", "args": [64, 64]}},
      {"spec": {"type": "Linear", "args": [64, 64]}}]})");
  const ModuleName name = Name("pre/m");
  absl::StatusOr<std::unique_ptr<Prewrite>> prewrite =
      repo_->StartPrewrite(name, m);
  ASSERT_THAT(prewrite, IsOk());
  (*prewrite)->Wait();
  ASSERT_THAT(DataFiles("pre/m"), ElementsAre("data-1.safetensors"));
  // Decisions changed two tensors after the bytes were written: one got
  // new bytes (a replacement, or a write while the prewrite still viewed
  // the old ones), the other was written in place by its sole owner (a new
  // version of the same storage). Neither is adopted; the two others are.
  StateDict change;
  change.tensors.Set("1.bias", Filled(DType::kFloat32, {64}, 2.0));
  ASSERT_THAT(m->LoadStateDict(change, {.strict = false}), IsOk());
  std::shared_ptr<Storage> in_place;
  for (const auto& [key, t] : m->NamedParameters()) {
    if (key == "0.bias") in_place = t.storage();
  }
  ASSERT_NE(in_place, nullptr);
  in_place->MarkWritten();
  std::vector<PrewrittenBytes> unchanged = (*prewrite)->Unchanged();
  EXPECT_THAT(unchanged, SizeIs(3));  // 1.bias's old storage is unused now
  ASSERT_THAT(repo_->Save(name, *m, Note("build"), unchanged), IsOk());
  (*prewrite)->Keep();
  prewrite->reset();
  // Save wrote only the two changed tensors, into a file of their own.
  ASSERT_THAT(DataFiles("pre/m"),
              ElementsAre("data-1.safetensors", "data-2.safetensors"));
  EXPECT_THAT(FileShapes("pre/m", "data-2.safetensors"),
              ElementsAre(ElementsAre(64), ElementsAre(64)));

  ModuleRepository::LoadReport report = Reload();
  ASSERT_THAT(report.errors, IsEmpty());
  ASSERT_THAT(report.modules, SizeIs(1));
  ExpectSameTree(*m, *report.modules[0].root);
}

TEST_F(ModuleRepositoryTest, AnAbandonedPrewriteLeavesNothing) {
  std::shared_ptr<Module> m =
      Build(R"({"type": "Linear", "args": [256, 256]})");
  const ModuleName name = Name("pre/gone");
  {
    absl::StatusOr<std::unique_ptr<Prewrite>> prewrite =
        repo_->StartPrewrite(name, m);
    ASSERT_THAT(prewrite, IsOk());
    // Dropped without Wait, as a build refused while its bytes are written.
  }
  repo_->WaitForDeletions();
  EXPECT_FALSE(fs::exists(ModuleDir("pre/gone")));
  ModuleRepository::LoadReport report = Reload();
  EXPECT_THAT(report.errors, IsEmpty());
  EXPECT_THAT(report.modules, IsEmpty());
}

TEST_F(ModuleRepositoryTest, ManySmallChangesKeepFewFilesAndLittleDeadData) {
  std::shared_ptr<Module> m = Build(R"({"type": "Sequential", "children": [
      {"spec": {"type": "Linear", "args": [32, 32]}},
      {"spec": {"type": "Linear", "args": [32, 32]}},
      {"spec": {"type": "Linear", "args": [32, 32]}}]})");
  const ModuleName name = Name("inc/many");
  ASSERT_THAT(repo_->Save(name, *m, Note("build")), IsOk());
  const uint64_t live = m->TotalBytes();
  for (int i = 0; i < 100; ++i) {
    StateDict change;
    change.tensors.Set(absl::StrCat(i % 3, ".weight"),
                       Filled(DType::kFloat32, {32, 32}, i));
    ASSERT_THAT(m->LoadStateDict(change, {.strict = false}), IsOk());
    ASSERT_THAT(repo_->Save(name, *m, Note("load_state_dict")), IsOk());
    uint64_t on_disk = 0;
    for (const std::string& f : DataFiles("inc/many")) {
      on_disk += fs::file_size(ModuleDir("inc/many") / f);
    }
    ASSERT_LE(DataFiles("inc/many").size(), 17u) << "after change " << i;
    ASSERT_LE(on_disk, 3 * live + (2 << 20)) << "after change " << i;
  }
  ModuleRepository::LoadReport report = Reload();
  ASSERT_THAT(report.modules, SizeIs(1));
  ExpectSameTree(*m, *report.modules[0].root);
}

TEST_F(ModuleRepositoryTest, LeftoversOfInterruptedWritesAreCleanedUp) {
  std::shared_ptr<Module> m = Build(R"({"type": "Linear", "args": [4, 4]})");
  ASSERT_THAT(repo_->Save(Name("crash/kept"), *m, Note("build")), IsOk());
  // A save that crashed before its manifest: a data file nobody names, a
  // temporary file; and a module whose first save never committed.
  std::ofstream(ModuleDir("crash/kept") / "data-9.safetensors") << "partial";
  std::ofstream(ModuleDir("crash/kept") / "manifest.json.tmp.1.2") << "{";
  absl::StatusOr<std::string> never =
      repo_->ReserveDataFile(Name("crash/never"));
  ASSERT_THAT(never, IsOk());
  std::ofstream(*never) << "x";

  ModuleRepository::LoadReport report = Reload();
  EXPECT_THAT(report.errors, IsEmpty());
  ASSERT_THAT(report.modules, SizeIs(1));
  EXPECT_THAT(DataFiles("crash/kept"), ElementsAre("data-1.safetensors"));
  EXPECT_FALSE(fs::exists(ModuleDir("crash/kept") / "manifest.json.tmp.1.2"));
  EXPECT_FALSE(fs::exists(ModuleDir("crash/never")));
  // The next file number skips the one the crashed save used.
  StateDict change;
  change.tensors.Set("bias", Filled(DType::kFloat32, {4}, 1));
  ASSERT_THAT(report.modules[0].root->LoadStateDict(change, {.strict = false}),
              IsOk());
  ASSERT_THAT(
      repo_->Save(Name("crash/kept"), *report.modules[0].root, Note("load")),
      IsOk());
  EXPECT_THAT(DataFiles("crash/kept"),
              ElementsAre("data-1.safetensors", "data-10.safetensors"));
}

TEST_F(ModuleRepositoryTest, MappedSavesSwitchTheTreeToItsFiles) {
  repo_->set_map_saved_bytes(true);
  std::shared_ptr<Module> m = Build(R"({"type": "Linear", "args": [8, 8]})");
  const Tensor weight = *m->parameters().Find("weight");
  // A reader's snapshot keeps the memory it views.
  const Tensor snapshot = weight.Detach();
  const StateDict before = m->GetStateDict();
  std::vector<Tensor> copies;
  for (const auto& item : before.tensors) copies.push_back(*item.value.Clone());
  ASSERT_THAT(repo_->Save(Name("map/m"), *m, Note("build")), IsOk());
  for (const auto& [key, t] : m->NamedParameters()) {
    EXPECT_TRUE(t.storage()->read_only()) << key;
    EXPECT_THAT(t.storage()->CheckIntegrity(), IsOk()) << key;
  }
  EXPECT_TRUE(weight.is_same(*m->parameters().Find("weight")));
  EXPECT_FALSE(snapshot.storage()->read_only());
  size_t i = 0;
  for (const auto& item : m->GetStateDict().tensors) {
    EXPECT_TRUE(TensorsEqual(item.value, copies[i++])) << item.key;
  }
  // The views keep the saved versions: saving again writes nothing.
  ASSERT_THAT(repo_->Save(Name("map/m"), *m, Note("again")), IsOk());
  EXPECT_THAT(DataFiles("map/m"), ElementsAre("data-1.safetensors"));
  // A change writes fresh memory, saved and then viewed in its new file.
  StateDict change;
  change.tensors.Set("bias", Filled(DType::kFloat32, {8}, 3));
  ASSERT_THAT(m->LoadStateDict(change, {.strict = false}), IsOk());
  EXPECT_FALSE(m->parameters().Find("bias")->storage()->read_only());
  ASSERT_THAT(repo_->Save(Name("map/m"), *m, Note("load")), IsOk());
  EXPECT_TRUE(m->parameters().Find("bias")->storage()->read_only());
  EXPECT_THAT(DataFiles("map/m"),
              ElementsAre("data-1.safetensors", "data-2.safetensors"));
  ModuleRepository::LoadReport report = Reload();
  const ModuleRepository::Loaded* loaded = FindLoaded(report, "map/m");
  ASSERT_NE(loaded, nullptr);
  ExpectSameTree(*m, *loaded->root);
}

// A saved module lists only its class's own attribute names, not the
// ~100 every module has (they made most of a small module's manifest); a
// manifest that lists them all, as saves before did, reads the same.
TEST_F(ModuleRepositoryTest, ClassAttributesSavedAreOnlyTheClasssOwn) {
  std::shared_ptr<Module> root = Module::Create("Odd");
  root->AddClassAttributes({"custom_method", "forward"});
  ASSERT_THAT(root->RegisterModule(
                  "lin", Build(R"({"type": "Linear", "args": [2, 3]})")),
              IsOk());
  ASSERT_THAT(repo_->Save(Name("t/odd"), *root, Note("build")), IsOk());
  const fs::path manifest = ModuleDir("t/odd") / "manifest.json";
  MODELSTATE_ASSERT_OK_AND_ASSIGN(std::string text,
                                  ReadFile(manifest.string()));
  nlohmann::json sealed = nlohmann::json::parse(text);
  nlohmann::json& modules = sealed["body"]["modules"];
  ASSERT_EQ(modules.size(), 2u);
  // "forward" is every module's; Linear's own are these two.
  EXPECT_EQ(modules[0]["class_attributes"],
            nlohmann::json::array({"custom_method"}));
  EXPECT_EQ(modules[1]["class_attributes"],
            nlohmann::json::array({"__constants__", "reset_parameters"}));

  // The form saves used to write: every name, the shared ones too.
  for (nlohmann::json& m : modules) {
    std::vector<std::string> all =
        m["class_attributes"].get<std::vector<std::string>>();
    for (const std::string& name :
         Module::Create("Bare")->ClassAttributeNames()) {
      all.push_back(name);
    }
    std::sort(all.begin(), all.end());
    m["class_attributes"] = all;
  }
  sealed["sha256"] = Sha256Hex(sealed["body"].dump());
  ASSERT_THAT(WriteFileAtomically(manifest.string(), sealed.dump()), IsOk());
  ModuleRepository::LoadReport report = Reload();
  ASSERT_THAT(report.errors, IsEmpty());
  ASSERT_THAT(report.modules, SizeIs(1));
  ExpectSameTree(*root, *report.modules[0].root);
  EXPECT_TRUE(report.modules[0].root->HasClassAttribute("custom_method"));
  EXPECT_FALSE(Module::Create("Bare")->HasClassAttribute("custom_method"));
}

class DamagedFileTest : public ModuleRepositoryTest {
 protected:
  void SetUp() override {
    ModuleRepositoryTest::SetUp();
    good_ = Build(R"({"type": "Linear", "args": [8, 8]})");
    bad_ = Build(R"({"type": "Linear", "args": [8, 8]})", 4);
    // Data file numbers are unique in the repository: d/bad, saved first,
    // gets data-1.
    ASSERT_THAT(repo_->Save(Name("d/bad"), *bad_, Note("build")), IsOk());
    ASSERT_THAT(repo_->Save(Name("d/good"), *good_, Note("build")), IsOk());
  }
  fs::path BadFile(const std::string& file) {
    return ModuleDir("d/bad") / file;
  }
  void FlipByte(const fs::path& path, uint64_t from_end) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-static_cast<int64_t>(from_end), std::ios::end);
    char c;
    f.read(&c, 1);
    c ^= 0x20;
    f.seekp(-static_cast<int64_t>(from_end), std::ios::end);
    f.write(&c, 1);
  }
  // Expects d/bad to fail with `message`, d/good to load, and d/bad's files
  // to be kept and protected from being overwritten.
  void ExpectOnlyBadFails(const ::testing::Matcher<std::string>& message) {
    std::vector<std::string> files_before = DataFiles("d/bad");
    ModuleRepository::LoadReport report = Reload();
    ASSERT_THAT(report.errors, SizeIs(1));
    EXPECT_THAT(report.errors[0].ToString(), message);
    ASSERT_THAT(report.modules, SizeIs(1));
    EXPECT_EQ(report.modules[0].name.full(), "d/good");
    ExpectSameTree(*good_, *report.modules[0].root);
    EXPECT_EQ(DataFiles("d/bad"), files_before);
    EXPECT_THAT(repo_->Save(Name("d/bad"), *good_, Note("build")),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("could not be loaded at start-up")));
  }

  std::shared_ptr<Module> good_;
  std::shared_ptr<Module> bad_;
};

TEST_F(DamagedFileTest, AFlippedDataByteLoadsButIsNeverServed) {
  // A restart reads no tensor bytes, so it cannot see the damage: the
  // module loads, and the read that meets the damaged tensor fails.
  FlipByte(BadFile("data-1.safetensors"), 3);
  ModuleRepository::LoadReport report = Reload();
  EXPECT_THAT(report.errors, IsEmpty());
  const ModuleRepository::Loaded* bad = FindLoaded(report, "d/bad");
  ASSERT_NE(bad, nullptr);
  for (const auto& [key, t] : bad->root->NamedParameters()) {
    EXPECT_TRUE(t.storage()->read_only()) << key;
  }
  EXPECT_THAT(
      CheckTensorBytes("weight", *bad->root->parameters().Find("weight")),
      IsOk());
  EXPECT_THAT(CheckHeldBytes(*bad->root),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("'bias'"), HasSubstr("module 'd/bad'"),
                             HasSubstr("d/bad/data-1.safetensors"),
                             HasSubstr("entry 's1'"))));
  // Its files stay as they are, for repair.
  EXPECT_EQ(DataFiles("d/bad"), std::vector<std::string>{"data-1.safetensors"});
}

TEST_F(DamagedFileTest, ARestartMapsTheBytesAndSavesOnlyWhatChanged) {
  ModuleRepository::LoadReport report = Reload();
  ASSERT_THAT(report.errors, IsEmpty());
  const ModuleRepository::Loaded* good = FindLoaded(report, "d/good");
  ASSERT_NE(good, nullptr);
  ExpectSameTree(*good_, *good->root);
  for (const auto& [key, t] : good->root->NamedParameters()) {
    EXPECT_TRUE(t.storage()->read_only()) << key;
  }
  // A change replaces the mapped storage; the file is not touched, and
  // only the changed bytes are written.
  StateDict change;
  change.tensors.Set("bias", Filled(DType::kFloat32, {8}, 2));
  ASSERT_THAT(good->root->LoadStateDict(change, {.strict = false}), IsOk());
  EXPECT_FALSE(good->root->parameters().Find("bias")->storage()->read_only());
  EXPECT_TRUE(good->root->parameters().Find("weight")->storage()->read_only());
  ASSERT_THAT(repo_->Save(Name("d/good"), *good->root, Note("load")), IsOk());
  EXPECT_THAT(DataFiles("d/good"),
              ElementsAre("data-2.safetensors", "data-3.safetensors"));
  ModuleRepository::LoadReport again = Reload();
  const ModuleRepository::Loaded* reloaded = FindLoaded(again, "d/good");
  ASSERT_NE(reloaded, nullptr);
  ExpectSameTree(*good->root, *reloaded->root);
}

TEST_F(DamagedFileTest, ATruncatedDataFileNamesTheFile) {
  fs::resize_file(BadFile("data-1.safetensors"),
                  fs::file_size(BadFile("data-1.safetensors")) - 10);
  ExpectOnlyBadFails(HasSubstr("d/bad/data-1.safetensors"));
}

TEST_F(DamagedFileTest, AMissingDataFileNamesTheFile) {
  fs::remove(BadFile("data-1.safetensors"));
  ExpectOnlyBadFails(HasSubstr("d/bad/data-1.safetensors"));
}

TEST_F(DamagedFileTest, AnEditedManifestFailsItsChecksum) {
  FlipByte(BadFile("manifest.json"), 200);
  ExpectOnlyBadFails(
      AllOf(HasSubstr("d/bad/manifest.json"), HasSubstr("checksum mismatch")));
}

TEST_F(DamagedFileTest, ATruncatedManifestNamesIt) {
  fs::resize_file(BadFile("manifest.json"), 100);
  ExpectOnlyBadFails(AllOf(HasSubstr("d/bad/manifest.json"),
                           HasSubstr("not a sealed JSON file")));
}

// Rewrites d/bad's manifest body with `edit` and a valid checksum, as a
// buggy or hostile writer could.
void EditManifest(const fs::path& path,
                  const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json sealed = nlohmann::json::parse(*ReadFile(path.string()));
  edit(sealed["body"]);
  sealed["sha256"] = Sha256Hex(sealed["body"].dump());
  ASSERT_THAT(WriteFileAtomically(path.string(), sealed.dump()), IsOk());
}

TEST_F(DamagedFileTest, AStorageTheDataFileDoesNotHoldIsRejected) {
  EditManifest(BadFile("manifest.json"), [](nlohmann::json& body) {
    body["storages"][0]["shape"] = {8, 9};
  });
  ExpectOnlyBadFails(AllOf(HasSubstr("d/bad/data-1.safetensors"),
                           HasSubstr("has no tensor 's0' of float32[8, 9]"),
                           HasSubstr("named by")));
}

TEST_F(DamagedFileTest, ATensorLargerThanItsBytesIsRejected) {
  EditManifest(BadFile("manifest.json"), [](nlohmann::json& body) {
    body["tensors"][0]["shape"] = {8, 9};
  });
  ExpectOnlyBadFails(
      AllOf(HasSubstr("d/bad/manifest.json"),
            HasSubstr("tensor 0: Expected 288 bytes for float32[8, 9]")));
}

TEST_F(DamagedFileTest, AMalformedManifestIsRejected) {
  EditManifest(BadFile("manifest.json"), [](nlohmann::json& body) {
    body["modules"][0].erase("parameters");
  });
  ExpectOnlyBadFails(
      AllOf(HasSubstr("d/bad/manifest.json"), HasSubstr("malformed manifest")));
}

TEST_F(DamagedFileTest, AnUnavailableDeviceFailsUnlessFallingBackToCpu) {
  EditManifest(BadFile("manifest.json"), [](nlohmann::json& body) {
    for (auto& t : body["tensors"]) t["device"] = "cuda:0";
  });
  ExpectOnlyBadFails(
      AllOf(HasSubstr("FAILED_PRECONDITION"), HasSubstr("cuda:0")));
  repo_ = Open();
  ModuleRepository::LoadReport report =
      repo_->LoadAll(/*fallback_to_cpu=*/true);
  EXPECT_THAT(report.errors, IsEmpty());
  ASSERT_THAT(report.modules, SizeIs(2));
  const ModuleRepository::Loaded* bad = FindLoaded(report, "d/bad");
  ASSERT_NE(bad, nullptr);
  ExpectSameState(bad->root->GetStateDict(), bad_->GetStateDict());
}

// Data files with neither a manifest, nor a deletion's tombstone, nor an
// unfinished first save's mark: a module whose manifest was lost. Its
// files are all that is left of it, so they stay.
TEST_F(ModuleRepositoryTest, ALostManifestKeepsTheDataFiles) {
  std::shared_ptr<Module> m = Build(R"({"type": "Linear", "args": [4, 4]})");
  ASSERT_THAT(repo_->Save(Name("lost/m"), *m, Note("build")), IsOk());
  EXPECT_FALSE(fs::exists(ModuleDir("lost/m") / "uncommitted"));
  fs::remove(ModuleDir("lost/m") / "manifest.json");

  ModuleRepository::LoadReport report = Reload();
  EXPECT_THAT(report.modules, IsEmpty());
  ASSERT_THAT(report.errors, SizeIs(1));
  EXPECT_THAT(report.errors[0],
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("lost/m/manifest.json: missing"),
                             HasSubstr("kept for repair"))));
  EXPECT_THAT(DataFiles("lost/m"), ElementsAre("data-1.safetensors"));
  EXPECT_THAT(repo_->CheckUsable(Name("lost/m")),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // A second start says so again, and still deletes nothing.
  report = Reload();
  EXPECT_THAT(report.errors, SizeIs(1));
  EXPECT_THAT(DataFiles("lost/m"), ElementsAre("data-1.safetensors"));
}

TEST_F(ModuleRepositoryTest, RemovalLeavesATombstoneUntilDropped) {
  std::shared_ptr<Module> m = Build(R"({"type": "Linear", "args": [2, 2]})");
  ASSERT_THAT(repo_->Save(Name("rm/a"), *m, Note("build")), IsOk());
  ASSERT_THAT(repo_->Remove(Name("rm/a"), Note("delete", "req-del")), IsOk());
  EXPECT_THAT(DataFiles("rm/a"), IsEmpty());

  ModuleRepository::LoadReport report = Reload();
  EXPECT_THAT(report.modules, IsEmpty());
  ASSERT_THAT(report.removed, SizeIs(1));
  EXPECT_EQ(report.removed[0].name.full(), "rm/a");
  EXPECT_EQ(report.removed[0].note.correlation_id, "req-del");
  repo_->DropTombstone(Name("rm/a"));
  report = Reload();
  EXPECT_THAT(report.removed, IsEmpty());
  EXPECT_FALSE(fs::exists(ModuleDir("rm/a")));
  // Removing what was never saved is fine.
  EXPECT_THAT(repo_->Remove(Name("rm/never"), Note("delete")), IsOk());
}

TEST_F(ModuleRepositoryTest, ADroppedTombstoneTakesTheEmptyDirectory) {
  std::shared_ptr<Module> m = Build(R"({"type": "Linear", "args": [2, 2]})");
  ASSERT_THAT(repo_->Save(Name("rm/a"), *m, Note("build")), IsOk());
  ASSERT_THAT(repo_->Remove(Name("rm/a"), Note("delete")), IsOk());
  repo_->DropTombstone(Name("rm/a"));
  repo_->WaitForDeletions();
  // Not left for the next start-up to sweep: a server that builds and
  // deletes many names would otherwise keep a directory for each.
  EXPECT_FALSE(fs::exists(ModuleDir("rm/a")));
  // One being written again under the name keeps its directory.
  ASSERT_THAT(repo_->Save(Name("rm/b"), *m, Note("build")), IsOk());
  absl::StatusOr<std::string> reserved = repo_->ReserveDataFile(Name("rm/b"));
  ASSERT_THAT(reserved.status(), IsOk());
  ASSERT_THAT(repo_->Remove(Name("rm/b"), Note("delete")), IsOk());
  repo_->DropTombstone(Name("rm/b"));
  repo_->WaitForDeletions();
  EXPECT_TRUE(fs::is_directory(ModuleDir("rm/b")));
  repo_->ReleaseDataFile(Name("rm/b"), *reserved);
  EXPECT_FALSE(fs::exists(ModuleDir("rm/b")));
}

TEST_F(ModuleRepositoryTest, ARemovalCutShortStillRemoves) {
  std::shared_ptr<Module> m = Build(R"({"type": "Linear", "args": [2, 2]})");
  ASSERT_THAT(repo_->Save(Name("rm/a"), *m, Note("build")), IsOk());
  const fs::path manifest = ModuleDir("rm/a") / "manifest.json";
  const std::string manifest_text = *ReadFile(manifest.string());
  const std::string data =
      *ReadFile((ModuleDir("rm/a") / "data-1.safetensors").string());
  ASSERT_THAT(repo_->Remove(Name("rm/a"), Note("delete")), IsOk());
  // As if the crash came after the tombstone but before the manifest went.
  ASSERT_THAT(WriteFileAtomically(manifest.string(), manifest_text), IsOk());
  ASSERT_THAT(WriteFileAtomically(
                  (ModuleDir("rm/a") / "data-1.safetensors").string(), data),
              IsOk());
  ModuleRepository::LoadReport report = Reload();
  EXPECT_THAT(report.errors, IsEmpty());
  EXPECT_THAT(report.modules, IsEmpty());
  EXPECT_THAT(report.removed, SizeIs(1));
  EXPECT_FALSE(fs::exists(manifest));
}

TEST_F(ModuleRepositoryTest, AModuleBuiltAgainAfterRemovalIsKept) {
  std::shared_ptr<Module> first =
      Build(R"({"type": "Linear", "args": [2, 2]})");
  ASSERT_THAT(repo_->Save(Name("rm/a"), *first, Note("build")), IsOk());
  ASSERT_THAT(repo_->Remove(Name("rm/a"), Note("delete")), IsOk());
  // Built again before the tombstone was dropped (a crash in between).
  std::shared_ptr<Module> second =
      Build(R"({"type": "Linear", "args": [3, 1]})");
  ASSERT_THAT(repo_->Save(Name("rm/a"), *second, Note("build", "r2")), IsOk());
  ModuleRepository::LoadReport report = Reload();
  EXPECT_THAT(report.errors, IsEmpty());
  EXPECT_THAT(report.removed, SizeIs(1));
  ASSERT_THAT(report.modules, SizeIs(1));
  ExpectSameTree(*second, *report.modules[0].root);
}

// A build held by its hooks has prewritten its bytes under the name while
// another module of that name was deleted: the deletion must not take the
// held build's file, which it commits once it goes on.
TEST_F(ModuleRepositoryTest, ARemovalLeavesTheFilesOfAHeldBuild) {
  const ModuleName name = Name("rm/held");
  std::shared_ptr<Module> first = Build(R"({"type": "ReLU"})");
  std::shared_ptr<Module> held =
      Build(R"({"type": "Linear", "args": [64, 64]})");
  absl::StatusOr<std::unique_ptr<Prewrite>> prewrite =
      repo_->StartPrewrite(name, held);
  ASSERT_THAT(prewrite, IsOk());
  (*prewrite)->Wait();
  ASSERT_THAT(repo_->Save(name, *first, Note("build")), IsOk());
  ASSERT_THAT(repo_->Remove(name, Note("delete")), IsOk());
  repo_->WaitForDeletions();
  std::vector<PrewrittenBytes> unchanged = (*prewrite)->Unchanged();
  EXPECT_THAT(unchanged, SizeIs(2));
  ASSERT_THAT(repo_->Save(name, *held, Note("build", "r2"), unchanged), IsOk());
  (*prewrite)->Keep();
  prewrite->reset();
  // Adopted, not written again (a save finding the file gone rewrites it).
  EXPECT_THAT(DataFiles("rm/held"), ElementsAre("data-1.safetensors"));
  repo_->DropTombstone(name);
  repo_->WaitForDeletions();
  ModuleRepository::LoadReport report = Reload();
  EXPECT_THAT(report.errors, IsEmpty());
  ASSERT_THAT(report.modules, SizeIs(1));
  ExpectSameTree(*held, *report.modules[0].root);
}

// The same for a load still receiving its bytes into a reserved data file.
TEST_F(ModuleRepositoryTest, ARemovalLeavesAReservedDataFile) {
  const ModuleName name = Name("rm/staged");
  std::shared_ptr<Module> m = Build(R"({"type": "Linear", "args": [2, 2]})");
  ASSERT_THAT(repo_->Save(name, *m, Note("build")), IsOk());
  absl::StatusOr<std::string> reserved = repo_->ReserveDataFile(name);
  ASSERT_THAT(reserved, IsOk());
  ASSERT_THAT(WriteFileAtomically(*reserved, "staged bytes"), IsOk());
  ASSERT_THAT(repo_->Remove(name, Note("delete")), IsOk());
  repo_->WaitForDeletions();
  EXPECT_TRUE(fs::exists(*reserved));
  repo_->ReleaseDataFile(name, *reserved);
}

}  // namespace
}  // namespace modelstate

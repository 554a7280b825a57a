#include "service/module_repository.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/crc32c.h"
#include "base/file_util.h"
#include "base/mapped_file.h"
#include "base/quote.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "core/safetensors.h"
#include "nlohmann/json.hpp"
#include "service/data_dir.h"

namespace modelstate {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr int kManifestFormat = 1;
// More data files than this in use, and the next save rewrites them all.
constexpr size_t kMaxDataFiles = 16;
// Dead bytes tolerated in the data files still in use before the next save
// rewrites them: as many as the live ones, plus this.
constexpr uint64_t kDeadBytesSlack = uint64_t{1} << 20;

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what));
}

using data_dir::DataFileName;
using data_dir::DataFileNumber;
using data_dir::FilePath;

// The lowest data file number that no file in `dir` has: a crashed save
// may have left files behind, and their names are never reused.
uint64_t FreeDataFileNumber(const std::string& dir) {
  uint64_t next = 1;
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    next = std::max(next, DataFileNumber(item.path().filename().string()) + 1);
  }
  return next;
}

// Identifies a storage's bytes as they are now (see Storage::version), read
// as `dtype`.
std::string VersionKey(const Storage& storage, DType dtype) {
  return absl::StrCat(storage.version(), ":", DTypeName(dtype));
}

Json NoteToJson(const ChangeNote& note) {
  return Json{{"type", note.type},
              {"identity", note.identity},
              {"correlation_id", note.correlation_id},
              {"audit_seq", note.audit_seq}};
}

ChangeNote NoteFromJson(const Json& j) {
  ChangeNote note;
  note.type = j.at("type").get<std::string>();
  note.identity = j.at("identity").get<std::string>();
  note.correlation_id = j.at("correlation_id").get<std::string>();
  note.audit_seq = j.at("audit_seq").get<uint64_t>();
  return note;
}

// A file of JSON `body` plus the SHA-256 of the body's canonical text, so
// that a flipped byte anywhere is caught on reading.
std::string Seal(const Json& body) {
  // Bytes that are not UTF-8 (in an error text) are replaced, not thrown
  // on; valid text dumps exactly as with the defaults.
  constexpr auto kReplace = Json::error_handler_t::replace;
  const std::string text = body.dump(-1, ' ', false, kReplace);
  return Json{{"body", body}, {"sha256", Sha256Hex(text)}}.dump(-1, ' ', false,
                                                                kReplace);
}

// `text` is the contents of `path` (a file, or what another replica sent).
absl::StatusOr<Json> UnsealText(absl::string_view text,
                                const std::string& path) {
  Json sealed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!sealed.is_object() || !sealed.contains("body") ||
      !sealed.contains("sha256") || !sealed["sha256"].is_string()) {
    return Corrupt(path,
                   text.empty() ? "empty file" : "not a sealed JSON file");
  }
  if (Sha256Hex(sealed["body"].dump()) != sealed["sha256"].get<std::string>()) {
    return Corrupt(path, "checksum mismatch (the file was changed or damaged)");
  }
  return std::move(sealed["body"]);
}

absl::StatusOr<Json> Unseal(const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return UnsealText(text, path);
}

// Python spells floats like this; JSON has no NaN or infinities.
Json EncodeDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

double DecodeDouble(const Json& j) {
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    throw std::invalid_argument("bad float '" + s + "'");
  }
  return j.get<double>();
}

// ---------------------------------------------------------------------------
// Writing

// The manifest of one tree: modules (root first, each once), tensors (each
// object once, so ties survive) and the storages behind them (each once per
// dtype, so tensors sharing bytes keep sharing them).
class TreeEncoder {
 public:
  struct StorageUse {
    std::shared_ptr<Storage> storage;
    DType dtype;
    Shape shape;                  // of the first tensor seen on it
    std::vector<Tensor> tensors;  // every tensor object on it
  };

  explicit TreeEncoder(const Module& root) {
    IndexOf(&root);
    for (size_t i = 0; i < order_.size(); ++i) {
      modules_.push_back(EncodeModule(*order_[i]));
    }
  }

  Json& modules() { return modules_; }
  Json& tensors() { return tensors_; }
  const std::vector<StorageUse>& storages() const { return storages_; }

 private:
  size_t IndexOf(const Module* m) {
    auto [it, added] = module_index_.try_emplace(m, order_.size());
    if (added) order_.push_back(m);
    return it->second;
  }

  Json TensorRef(const Tensor& t) {
    if (!t.defined()) return nullptr;
    auto [it, added] = tensor_index_.try_emplace(t.identity(), tensors_.size());
    if (!added) return it->second;
    Json storage = nullptr;
    if (t.storage() != nullptr) {
      auto key = std::make_pair(t.storage().get(), t.dtype());
      auto [sit, new_storage] =
          storage_index_.try_emplace(key, storages_.size());
      if (new_storage) {
        storages_.push_back({t.storage(), t.dtype(), t.shape(), {}});
      }
      storages_[sit->second].tensors.push_back(t);
      storage = sit->second;
    }
    tensors_.push_back(Json{{"dtype", std::string(DTypeName(t.dtype()))},
                            {"shape", t.shape()},
                            {"device", t.device().ToString()},
                            {"parameter", t.is_parameter()},
                            {"requires_grad", t.requires_grad()},
                            {"storage", storage}});
    return it->second;
  }

  Json EncodeAttribute(const AttrValue& value) {
    struct Visitor {
      TreeEncoder* self;
      Json operator()(std::monostate) const { return {"none", nullptr}; }
      Json operator()(bool v) const { return {"bool", v}; }
      Json operator()(int64_t v) const { return {"int", v}; }
      Json operator()(double v) const { return {"float", EncodeDouble(v)}; }
      Json operator()(const std::string& v) const { return {"str", v}; }
      Json operator()(const std::vector<int64_t>& v) const {
        return {"ints", v};
      }
      Json operator()(const std::vector<double>& v) const {
        Json list = Json::array();
        for (double d : v) list.push_back(EncodeDouble(d));
        return {"floats", list};
      }
      Json operator()(const Tensor& t) const {
        return {"tensor", self->TensorRef(t)};
      }
    };
    return std::visit(Visitor{this}, value);
  }

  Json EncodeModule(const Module& m) {
    Json parameters = Json::array();
    for (const auto& item : m.parameters()) {
      parameters.push_back({item.key, TensorRef(item.value)});
    }
    Json buffers = Json::array();
    for (const auto& item : m.buffers()) {
      buffers.push_back(
          {item.key, TensorRef(item.value), m.IsPersistentBuffer(item.key)});
    }
    Json children = Json::array();
    for (const auto& item : m.children()) {
      Json child = nullptr;
      if (item.value != nullptr) child = IndexOf(item.value.get());
      children.push_back({item.key, child});
    }
    Json attributes = Json::array();
    for (const auto& item : m.attributes()) {
      Json encoded = EncodeAttribute(item.value);
      attributes.push_back({item.key, encoded[0], encoded[1]});
    }
    return Json{
        {"type", m.type_name()},
        {"qualified_name", m.qualified_name()},
        {"version", m.version()},
        {"fixed_shapes", m.fixed_shapes()},
        {"training", m.is_training()},
        {"fills_num_batches_tracked", m.fills_num_batches_tracked()},
        // Not the ~100 names every module has: a file that lists them too
        // (as files saved before did) reads the same.
        {"class_attributes", m.OwnClassAttributeNames()},
        {"extra_state", m.has_extra_state()
                            ? Json{{"tensor", TensorRef(m.extra_state())}}
                            : Json(nullptr)},
        {"parameters", std::move(parameters)},
        {"buffers", std::move(buffers)},
        {"children", std::move(children)},
        {"attributes", std::move(attributes)}};
  }

  std::vector<const Module*> order_;
  absl::flat_hash_map<const Module*, size_t> module_index_;
  absl::flat_hash_map<const void*, size_t> tensor_index_;
  absl::flat_hash_map<std::pair<const Storage*, DType>, size_t> storage_index_;
  std::vector<StorageUse> storages_;
  Json modules_ = Json::array();
  Json tensors_ = Json::array();
};

// The bytes of `use` as they go to disk (copied to the host first when they
// live on an accelerator).
absl::StatusOr<Tensor> HostTensor(const TreeEncoder::StorageUse& use) {
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor t, Tensor::FromStorage(use.dtype, use.shape, use.storage));
  if (t.device().is_cpu()) return t;
  return t.To(Device::Cpu(), use.dtype);
}

absl::string_view BytesOf(const Tensor& t) {
  return absl::string_view(static_cast<const char*>(t.raw_data()), t.nbytes());
}

// After a committed save: every CPU storage of the tree switches to a view
// of its bytes in the data file that now holds them (Storage::
// MapSavedBytes), so that they live in the page cache rather than in this
// process's memory. A storage seen with two dtypes keeps its memory (two
// views would untie them), and so does a file that cannot be mapped: the
// save stands either way. `where[i]` (file, key, crc32c) is uses[i]'s.
template <typename Where>
void MapSavedBytes(const std::string& dir, const ModuleName& name,
                   const std::vector<TreeEncoder::StorageUse>& uses,
                   const std::vector<Where>& where) {
  absl::flat_hash_map<const Storage*, int> uses_of;
  for (const TreeEncoder::StorageUse& use : uses) ++uses_of[use.storage.get()];
  struct Mapped {
    std::shared_ptr<const MappedFile> file;
    absl::flat_hash_map<std::string, uint64_t> offsets;  // key -> offset
  };
  std::map<std::string, std::optional<Mapped>> files;
  for (size_t i = 0; i < uses.size(); ++i) {
    const Storage& saved = *uses[i].storage;
    if (!saved.device().is_cpu() || saved.read_only() || saved.nbytes() == 0 ||
        uses_of[&saved] != 1) {
      continue;
    }
    auto [it, added] = files.try_emplace(where[i].file);
    if (added) {
      const std::string path = FilePath(dir, where[i].file);
      absl::StatusOr<std::shared_ptr<const MappedFile>> file =
          MappedFile::Open(path);
      if (!file.ok()) continue;
      absl::StatusOr<SafetensorsHeader> header =
          ParseSafetensorsHeader((*file)->bytes(), (*file)->bytes().size());
      if (!header.ok()) continue;
      Mapped mapped{*std::move(file), {}};
      for (const SafetensorsEntry& e : header->entries) {
        if (e.end - e.begin == 0) continue;
        mapped.offsets[e.key] = header->data_start + e.begin;
      }
      it->second = std::move(mapped);
    }
    if (!it->second.has_value()) continue;
    auto offset = it->second->offsets.find(where[i].key);
    if (offset == it->second->offsets.end() ||
        offset->second % std::min<size_t>(ElementSize(uses[i].dtype), 8) != 0) {
      continue;
    }
    std::shared_ptr<Storage> view = Storage::MapSavedBytes(
        saved, it->second->file, offset->second, where[i].crc32c,
        absl::StrCat("module '", name.full(), "', ",
                     FilePath(dir, where[i].file), " entry '", where[i].key,
                     "'"));
    for (Tensor t : uses[i].tensors) {
      absl::StatusOr<Tensor> on_view =
          Tensor::FromStorage(t.dtype(), t.shape(), view);
      if (on_view.ok()) t.SetData(*on_view);
    }
  }
}

// The data files of `dir` not in `keep` and not reserved, and temporary
// files left by interrupted writes (other than a reserved file's).
bool HasDataFiles(const std::string& dir) {
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    if (data_dir::DataFileNumber(item.path().filename().string()) != 0) {
      return true;
    }
  }
  return false;
}

std::vector<std::string> UnusedFiles(
    const std::string& dir, const std::map<std::string, uint64_t>& keep,
    const absl::flat_hash_set<std::string>& reserved) {
  std::vector<std::string> unused;
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(dir, ec)) {
    std::string name = item.path().filename().string();
    std::string base(data_dir::TempFileTarget(name));
    if (reserved.contains(base)) continue;
    bool unused_data = DataFileNumber(name) != 0 && !keep.contains(name);
    if (unused_data || base != name) unused.push_back(item.path().string());
  }
  return unused;
}

// A move mark's content, for an operator (a restart reads only whether the
// file is there): which way the module was going, and the other replica.
std::string MoveMarkText(absl::string_view direction, absl::string_view peer) {
  return Json{{"move", direction}, {"peer", peer}}.dump(
             -1, ' ', false, Json::error_handler_t::replace) +
         "\n";
}

// ---------------------------------------------------------------------------
// Reading

// Builds the tree a manifest body describes; throws nlohmann's exceptions
// (or std::invalid_argument) for malformed JSON, returns errors for
// well-formed but impossible content.
class TreeDecoder {
 public:
  // `module` names the tree in errors; with `verify_now` every byte is
  // checked against its CRC while decoding, not when first needed.
  TreeDecoder(std::string dir, std::string manifest_path, std::string module,
              bool fallback_to_cpu, bool verify_now)
      : dir_(std::move(dir)),
        path_(std::move(manifest_path)),
        module_(std::move(module)),
        fallback_to_cpu_(fallback_to_cpu),
        verify_now_(verify_now) {}

  // Maps the storages, then builds the tensors, then the modules.
  absl::StatusOr<std::shared_ptr<Module>> Decode(const Json& body) {
    MODELSTATE_RETURN_IF_ERROR(ReadStorages(body.at("storages")));
    for (const Json& t : body.at("tensors")) {
      MODELSTATE_ASSIGN_OR_RETURN(Tensor tensor, DecodeTensor(t));
      tensors_.push_back(std::move(tensor));
    }
    const Json& modules = body.at("modules");
    if (modules.empty()) return Corrupt(path_, "no modules");
    for (const Json& m : modules) {
      modules_.push_back(
          Module::Create(m.at("type").get<std::string>(),
                         m.at("qualified_name").get<std::string>()));
    }
    for (size_t i = 0; i < modules.size(); ++i) {
      MODELSTATE_RETURN_IF_ERROR(FillModule(*modules_[i], modules[i]));
    }
    return modules_[0];
  }

  // Where each storage read is on disk, by its version key (see Save).
  struct Stored {
    std::string version_key;
    std::string file;
    std::string key;
    uint32_t crc32c;
  };
  const std::vector<Stored>& stored() const { return stored_; }
  uint64_t bytes() const { return bytes_; }

 private:
  struct StorageRecord {
    std::string key;
    DType dtype;
    Shape shape;
    uint32_t crc32c;
    size_t index;
  };

  absl::Status ReadStorages(const Json& storages) {
    std::map<std::string, std::vector<StorageRecord>> by_file;
    for (size_t i = 0; i < storages.size(); ++i) {
      const Json& s = storages[i];
      std::string file = s.at("file").get<std::string>();
      if (DataFileNumber(file) == 0) {
        return Corrupt(
            path_,
            absl::StrCat("storage ", i, " names a bad data file '", file, "'"));
      }
      MODELSTATE_ASSIGN_OR_RETURN(DType dtype,
                                  ParseDType(s.at("dtype").get<std::string>()));
      by_file[file].push_back({s.at("key").get<std::string>(), dtype,
                               s.at("shape").get<Shape>(),
                               s.at("crc32c").get<uint32_t>(), i});
    }
    storages_.resize(storages.size());
    for (const auto& [file, records] : by_file) {
      MODELSTATE_RETURN_IF_ERROR(ReadDataFile(file, records));
    }
    return absl::OkStatus();
  }

  // Maps the data file and views each record's bytes in place: nothing is
  // read, so a restart costs the same whatever the bytes hosted. Their CRCs
  // are checked when the bytes are first needed (Storage::CheckIntegrity)
  // or here already with `verify_now_`. Bytes not aligned for their dtype
  // (a staged load's packed layout can leave them so) are read instead.
  absl::Status ReadDataFile(const std::string& file,
                            const std::vector<StorageRecord>& records) {
    const std::string path = FilePath(dir_, file);
    absl::StatusOr<std::shared_ptr<const MappedFile>> mapped =
        MappedFile::Open(path);
    if (!mapped.ok()) {
      return absl::DataLossError(
          absl::StrCat(mapped.status().message(), " (named by ", path_, ")"));
    }
    const absl::string_view contents = (*mapped)->bytes();
    absl::StatusOr<SafetensorsHeader> header =
        ParseSafetensorsHeader(contents, contents.size());
    if (!header.ok()) {
      return absl::DataLossError(absl::StrCat(
          path, ": ", header.status().message(), " (named by ", path_, ")"));
    }
    absl::flat_hash_map<std::string, const SafetensorsEntry*> entries;
    for (const SafetensorsEntry& e : header->entries) entries[e.key] = &e;
    for (const StorageRecord& r : records) {
      auto it = entries.find(r.key);
      if (it == entries.end() || it->second->dtype != r.dtype ||
          it->second->shape != r.shape) {
        return Corrupt(
            path,
            absl::StrCat("has no tensor '", r.key, "' of ", DTypeName(r.dtype),
                         ShapeToString(r.shape), " (named by ", path_, ")"));
      }
      const uint64_t offset = header->data_start + it->second->begin;
      const uint64_t nbytes = it->second->end - it->second->begin;
      std::shared_ptr<Storage> storage;
      if (nbytes > 0 &&
          offset % std::min<size_t>(ElementSize(r.dtype), 8) == 0) {
        storage =
            Storage::MapFileBytes(*mapped, offset, nbytes, r.crc32c,
                                  absl::StrCat("module '", module_, "', ", path,
                                               " entry '", r.key, "'"));
      } else {
        MODELSTATE_ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(r.dtype, r.shape));
        if (nbytes > 0) {
          MODELSTATE_ASSIGN_OR_RETURN(void* data, t.MutableDataForOverwrite());
          std::memcpy(data, contents.data() + offset, nbytes);
        }
        if (uint32_t crc = Crc32c(BytesOf(t)); crc != r.crc32c) {
          return Corrupt(
              path, absl::StrCat("tensor '", r.key, "' is damaged (CRC-32C ",
                                 crc, ", expected ", r.crc32c, ")"));
        }
        storage = t.storage();
      }
      if (verify_now_) {
        absl::Status intact = storage->CheckIntegrity();
        if (!intact.ok()) return intact;
      }
      stored_.push_back({VersionKey(*storage, r.dtype), file, r.key, r.crc32c});
      bytes_ += nbytes;
      storages_[r.index] = std::move(storage);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Tensor> DecodeTensor(const Json& j) {
    MODELSTATE_ASSIGN_OR_RETURN(DType dtype,
                                ParseDType(j.at("dtype").get<std::string>()));
    Shape shape = j.at("shape").get<Shape>();
    MODELSTATE_ASSIGN_OR_RETURN(Device device,
                                ParseDevice(j.at("device").get<std::string>()));
    const size_t index = tensors_.size();
    Tensor t;
    if (device.is_meta()) {
      MODELSTATE_ASSIGN_OR_RETURN(t, Tensor::Empty(dtype, shape, device));
    } else {
      const Json& s = j.at("storage");
      size_t storage = s.is_null() ? storages_.size() : s.get<size_t>();
      if (storage >= storages_.size()) {
        return Corrupt(
            path_, absl::StrCat("tensor ", index, " names no stored bytes"));
      }
      std::shared_ptr<Storage>& bytes = storages_[storage];
      if (!device.is_cpu() && bytes->device() != device) {
        absl::Status available = CheckDeviceAvailable(device);
        if (available.ok()) {
          // The storage moves once, so tensors sharing it stay tied; its
          // bytes are read now, so they are checked now.
          MODELSTATE_RETURN_IF_ERROR(bytes->CheckIntegrity());
          MODELSTATE_ASSIGN_OR_RETURN(
              std::shared_ptr<Storage> moved,
              Storage::Allocate(bytes->nbytes(), device));
          MODELSTATE_RETURN_IF_ERROR(CopyBytes(device, moved->data(),
                                               bytes->device(), bytes->data(),
                                               bytes->nbytes()));
          bytes = std::move(moved);
        } else if (!fallback_to_cpu_) {
          return absl::FailedPreconditionError(absl::StrCat(
              path_, ": tensor ", index, ": ", available.message()));
        }
      }
      absl::StatusOr<Tensor> restored =
          Tensor::FromStorage(dtype, shape, bytes);
      if (!restored.ok()) {
        return Corrupt(path_, absl::StrCat("tensor ", index, ": ",
                                           restored.status().message()));
      }
      t = *std::move(restored);
    }
    const bool requires_grad = j.at("requires_grad").get<bool>();
    if (j.at("parameter").get<bool>()) {
      absl::StatusOr<Tensor> p = MakeParameter(t, requires_grad);
      if (!p.ok()) {
        return Corrupt(
            path_, absl::StrCat("tensor ", index, ": ", p.status().message()));
      }
      return p;
    }
    if (requires_grad) MODELSTATE_RETURN_IF_ERROR(t.SetRequiresGrad(true));
    return t;
  }

  absl::StatusOr<Tensor> TensorAt(const Json& ref) {
    if (ref.is_null()) return Tensor();
    size_t i = ref.get<size_t>();
    if (i >= tensors_.size()) {
      return Corrupt(path_, absl::StrCat("no tensor ", i));
    }
    return tensors_[i];
  }

  absl::StatusOr<AttrValue> DecodeAttribute(const std::string& kind,
                                            const Json& value) {
    if (kind == "none") return AttrValue(std::monostate());
    if (kind == "bool") return AttrValue(value.get<bool>());
    if (kind == "int") return AttrValue(value.get<int64_t>());
    if (kind == "float") return AttrValue(DecodeDouble(value));
    if (kind == "str") return AttrValue(value.get<std::string>());
    if (kind == "ints") return AttrValue(value.get<std::vector<int64_t>>());
    if (kind == "floats") {
      std::vector<double> list;
      for (const Json& d : value) list.push_back(DecodeDouble(d));
      return AttrValue(std::move(list));
    }
    if (kind == "tensor") {
      MODELSTATE_ASSIGN_OR_RETURN(Tensor t, TensorAt(value));
      return AttrValue(std::move(t));
    }
    return Corrupt(path_, absl::StrCat("unknown attribute kind '", kind, "'"));
  }

  absl::Status FillModule(Module& m, const Json& j) {
    // Restoring is not a registration anyone decides: no hooks.
    RegistrationContext restore;
    restore.hooks = nullptr;
    auto fail = [&](const absl::Status& s) {
      return Corrupt(
          path_, absl::StrCat("module '", m.type_name(), "': ", s.message()));
    };
    for (const Json& p : j.at("parameters")) {
      MODELSTATE_ASSIGN_OR_RETURN(Tensor t, TensorAt(p.at(1)));
      absl::StatusOr<RegistrationOutcome> r =
          m.RegisterParameter(p.at(0).get<std::string>(), t, restore);
      if (!r.ok()) return fail(r.status());
    }
    for (const Json& b : j.at("buffers")) {
      MODELSTATE_ASSIGN_OR_RETURN(Tensor t, TensorAt(b.at(1)));
      absl::StatusOr<RegistrationOutcome> r = m.RegisterBuffer(
          b.at(0).get<std::string>(), t, b.at(2).get<bool>(), restore);
      if (!r.ok()) return fail(r.status());
    }
    for (const Json& c : j.at("children")) {
      std::shared_ptr<Module> child;
      if (!c.at(1).is_null()) {
        size_t i = c.at(1).get<size_t>();
        if (i == 0 || i >= modules_.size()) {
          return Corrupt(path_, absl::StrCat("no module ", i));
        }
        child = modules_[i];
      }
      absl::StatusOr<RegistrationOutcome> r =
          m.RegisterModule(c.at(0).get<std::string>(), child, restore);
      if (!r.ok()) return fail(r.status());
    }
    for (const Json& a : j.at("attributes")) {
      MODELSTATE_ASSIGN_OR_RETURN(
          AttrValue value,
          DecodeAttribute(a.at(1).get<std::string>(), a.at(2)));
      m.SetPlainAttribute(a.at(0).get<std::string>(), std::move(value));
    }
    std::vector<std::string> class_attributes =
        j.at("class_attributes").get<std::vector<std::string>>();
    std::vector<absl::string_view> views(class_attributes.begin(),
                                         class_attributes.end());
    m.AddClassAttributes(views);
    m.set_version(j.at("version").get<int>());
    m.set_fixed_shapes(j.at("fixed_shapes").get<bool>());
    m.set_training(j.at("training").get<bool>());
    m.set_fills_num_batches_tracked(
        j.at("fills_num_batches_tracked").get<bool>());
    const Json& extra = j.at("extra_state");
    if (!extra.is_null()) {
      MODELSTATE_ASSIGN_OR_RETURN(Tensor t, TensorAt(extra.at("tensor")));
      m.EnableExtraState(std::move(t));
    }
    return absl::OkStatus();
  }

  const std::string dir_;
  const std::string path_;
  const std::string module_;
  const bool fallback_to_cpu_;
  const bool verify_now_;
  std::vector<std::shared_ptr<Storage>> storages_;
  std::vector<Tensor> tensors_;
  std::vector<std::shared_ptr<Module>> modules_;
  std::vector<Stored> stored_;
  uint64_t bytes_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModuleRepository>> ModuleRepository::Open(
    std::string dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": cannot create the module directory: ", ec.message()));
  }
  return std::unique_ptr<ModuleRepository>(
      new ModuleRepository(std::move(dir)));
}

ModuleRepository::ModuleRepository(std::string dir) : dir_(std::move(dir)) {
  deleter_ = std::thread([this] { DeleteQueued(); });
}

ModuleRepository::~ModuleRepository() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    deletions_changed_.SignalAll();
  }
  deleter_.join();
}

void ModuleRepository::DeleteUnused(const std::string& dir,
                                    const ModuleFiles* files, bool now) {
  static const std::map<std::string, uint64_t> kNone;
  static const absl::flat_hash_set<std::string> kNoReservations;
  MutexLock lock(&mu_);
  std::vector<std::string> unused =
      UnusedFiles(dir, files ? files->file_bytes : kNone,
                  files ? files->reserved : kNoReservations);
  if (!now) return QueueDeletions(std::move(unused));
  for (const std::string& path : unused) {
    std::error_code ec;
    fs::remove(path, ec);
  }
}

void ModuleRepository::QueueDeletions(std::vector<std::string> paths) {
  for (std::string& path : paths) deletions_.push_back(std::move(path));
  deletions_changed_.SignalAll();
}

std::string ModuleRepository::NextDataFile(ModuleFiles& files) {
  uint64_t number = std::max(files.next_file, min_next_file_);
  files.next_file = number + 1;
  min_next_file_ = number + 1;
  return DataFileName(number);
}

void ModuleRepository::DeleteQueued() {
  while (true) {
    std::string path;
    {
      MutexLock lock(&mu_);
      while (deletions_.empty() && !stopping_) deletions_changed_.Wait(&mu_);
      if (deletions_.empty()) return;
      path = std::move(deletions_.front());
      deletions_.pop_front();
      deleting_ = true;
    }
    std::error_code ec;
    fs::remove(path, ec);  // best effort: start-up deletes what is left
    MutexLock lock(&mu_);
    // A deletion's tombstone goes last: its module's directory then goes
    // too unless something of the name is being written there again.
    const fs::path dir = fs::path(path).parent_path();
    if (path == data_dir::TombstonePath(dir.string())) {
      auto files = files_.find(ModuleName{dir.parent_path().filename().string(),
                                          dir.filename().string()}
                                   .full());
      if (files == files_.end() ||
          (files->second->reserved.empty() && files->second->saves == 0)) {
        fs::remove(dir, ec);  // only if empty
      }
    }
    deleting_ = false;
    deletions_changed_.SignalAll();
  }
}

void ModuleRepository::WaitForDeletions() {
  MutexLock lock(&mu_);
  while (!deletions_.empty() || deleting_) deletions_changed_.Wait(&mu_);
}

void ModuleRepository::ReleaseDataFile(const ModuleName& name,
                                       const std::string& path) {
  std::shared_ptr<ModuleFiles> files = FilesOf(name);
  MutexLock lock(&mu_);
  files->reserved.erase(fs::path(path).filename().string());
  // The module was deleted while this file was staged, or its first save
  // never came (a build refused): its directory, empty now but for a first
  // save's mark, goes too (remove() leaves a directory that is not empty:
  // another save may be writing there meanwhile).
  const std::string dir = ModuleDir(name);
  if (files->reserved.empty() && files->saves == 0 &&
      !fs::exists(data_dir::ManifestPath(dir))) {
    std::error_code ignored;
    const std::string mark = data_dir::UncommittedPath(dir);
    size_t entries = 0;
    for (auto it = fs::directory_iterator(dir, ignored);
         it != fs::directory_iterator(); it.increment(ignored)) {
      ++entries;
    }
    if (entries == 1) fs::remove(mark, ignored);
    fs::remove(dir, ignored);
  }
}

std::string ModuleRepository::ModuleDir(const ModuleName& name) const {
  return data_dir::ModuleDir(dir_, name);
}

std::shared_ptr<ModuleRepository::ModuleFiles> ModuleRepository::FilesOf(
    const ModuleName& name) {
  MutexLock lock(&mu_);
  FilesOfLocked(name);
  return files_[name.full()];
}

ModuleRepository::ModuleFiles& ModuleRepository::FilesOfLocked(
    const ModuleName& name) {
  std::shared_ptr<ModuleFiles>& files = files_[name.full()];
  if (files == nullptr) {
    files = std::make_shared<ModuleFiles>();
    files->next_file = FreeDataFileNumber(ModuleDir(name));
  }
  return *files;
}

void ModuleRepository::MarkDamaged(const ModuleName& name,
                                   const absl::Status& why) {
  MutexLock lock(&mu_);
  damaged_[name.full()] = why;
}

absl::Status ModuleRepository::Damaged(const ModuleName& name) {
  MutexLock lock(&mu_);
  auto it = damaged_.find(name.full());
  if (it == damaged_.end()) return absl::OkStatus();
  // DATA_LOSS when bytes are damaged or missing; otherwise the server is
  // not in a state to serve it (a device it does not have, an unreadable
  // directory).
  return absl::Status(
      absl::IsDataLoss(it->second) ? absl::StatusCode::kDataLoss
                                   : absl::StatusCode::kFailedPrecondition,
      absl::StrCat("module '", name.full(),
                   "' is not served: its files could not be "
                   "loaded (",
                   it->second.message(), "); they are kept for repair"));
}

absl::Status ModuleRepository::CheckUsable(const ModuleName& name) {
  MutexLock lock(&mu_);
  if (!damaged_.contains(name.full())) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "module '", name.full(), "' has files in ", ModuleDir(name),
      " that could not be loaded at start-up; move them away (or repair them "
      "and restart) before using the name"));
}

absl::Status ModuleRepository::EnsureModuleDir(const ModuleName& name) {
  const std::string dir = ModuleDir(name);
  if (!fs::exists(dir)) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat(dir, ": cannot create: ", ec.message()));
    }
    // The new directory entries must be durable before the files in them.
    MODELSTATE_RETURN_IF_ERROR(FsyncParentDirectory(dir));
    MODELSTATE_RETURN_IF_ERROR(
        FsyncParentDirectory(data_dir::NamespaceDir(dir_, name.ns)));
  }
  // A first save marks the directory, durably, before any data file lands
  // in it: LoadAll may then delete what a crash left, where data files
  // without a manifest and without the mark are a module whose manifest
  // was lost (kept for repair).
  const std::string mark = data_dir::UncommittedPath(dir);
  if (fs::exists(data_dir::ManifestPath(dir)) || fs::exists(mark)) {
    return absl::OkStatus();
  }
  return WriteFileAtomically(mark, "");
}

void ModuleRepository::CommittedFirstSave(const std::string& dir) {
  // Losing this unlink to a crash is harmless: LoadAll drops a mark beside
  // a manifest.
  std::error_code ignored;
  fs::remove(data_dir::UncommittedPath(dir), ignored);
}

absl::StatusOr<std::string> ModuleRepository::ReserveDataFile(
    const ModuleName& name) {
  MODELSTATE_RETURN_IF_ERROR(CheckUsable(name));
  // Reserved before the directory is ensured: from then on no release of
  // another reservation takes the directory away (ReleaseDataFile), and one
  // that did just before is undone. Found and reserved at once: a Remove
  // between the two would drop the record this reservation goes into.
  std::string file;
  {
    MutexLock lock(&mu_);
    ModuleFiles& files = FilesOfLocked(name);
    file = NextDataFile(files);
    files.reserved.insert(file);
  }
  const std::string path = FilePath(ModuleDir(name), file);
  if (absl::Status ensured = EnsureModuleDir(name); !ensured.ok()) {
    // Nothing was written: no clean-up, just the reservation back.
    MutexLock lock(&mu_);
    FilesOfLocked(name).reserved.erase(file);
    return ensured;
  }
  return path;
}

void ModuleRepository::ForgetCommitted(const ModuleName& name,
                                       Deletion deletion) {
  static const std::map<std::string, uint64_t> kNone;
  static const absl::flat_hash_set<std::string> kNoReservations;
  const std::string dir = ModuleDir(name);
  MutexLock lock(&mu_);
  auto it = files_.find(name.full());
  std::vector<std::string> unused;
  if (it == files_.end()) {
    unused = UnusedFiles(dir, kNone, kNoReservations);
  } else {
    ModuleFiles& files = *it->second;
    files.by_version.clear();
    files.file_bytes.clear();
    unused = UnusedFiles(dir, files.file_bytes, files.reserved);
    if (files.reserved.empty() && files.saves == 0) files_.erase(it);
  }
  if (deletion == Deletion::kQueued) QueueDeletions(std::move(unused));
  if (deletion != Deletion::kNow) return;
  for (const std::string& path : unused) {
    std::error_code ignored;
    fs::remove(path, ignored);
  }
}

absl::StatusOr<std::unique_ptr<Prewrite>> ModuleRepository::StartPrewrite(
    const ModuleName& name, std::shared_ptr<const Module> root) {
  MODELSTATE_ASSIGN_OR_RETURN(std::string path, ReserveDataFile(name));
  std::unique_ptr<Prewrite> prewrite(new Prewrite());
  prewrite->repo_ = this;
  prewrite->name_ = name;
  prewrite->path_ = std::move(path);
  Prewrite* self = prewrite.get();
  prewrite->thread_ = std::thread([self, root = std::move(root)] {
    // A failure only costs the overlap: Save writes the bytes itself.
    self->ok_ = self->Write(*root).ok();
  });
  return prewrite;
}

absl::Status Prewrite::Write(const Module& root) {
  const std::vector<TreeEncoder::StorageUse> uses =
      TreeEncoder(root).storages();
  std::vector<SafetensorsEntry> layout;
  for (size_t i = 0; i < uses.size(); ++i) {
    layout.push_back({absl::StrCat("s", i), uses[i].dtype, uses[i].shape});
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFileWriter> writer,
                              SafetensorsFileWriter::Open(path_, layout));
  const std::string file = fs::path(path_).filename().string();
  for (size_t i = 0; i < uses.size(); ++i) {
    // Read before the bytes: a change after it shows as a new version.
    versions_.push_back(uses[i].storage->version());
    MODELSTATE_ASSIGN_OR_RETURN(Tensor host, HostTensor(uses[i]));
    written_.push_back({uses[i].storage, uses[i].dtype, file,
                        absl::StrCat("s", i), Crc32c(BytesOf(host))});
    MODELSTATE_RETURN_IF_ERROR(writer->Append(BytesOf(host)));
  }
  return writer->Finish();
}

void Prewrite::Wait() {
  if (thread_.joinable()) thread_.join();
}

std::vector<PrewrittenBytes> Prewrite::Unchanged() const {
  std::vector<PrewrittenBytes> unchanged;
  if (!ok_) return unchanged;
  for (size_t i = 0; i < written_.size(); ++i) {
    if (written_[i].storage->version() == versions_[i]) {
      unchanged.push_back(written_[i]);
    }
  }
  return unchanged;
}

Prewrite::~Prewrite() {
  Wait();
  if (!keep_) {
    std::error_code ignored;
    fs::remove(path_, ignored);
  }
  repo_->ReleaseDataFile(name_, path_);
}

ModuleRepository::SaveInProgress::SaveInProgress(ModuleRepository& repo,
                                                 ModuleFiles& files)
    : repo_(repo), files_(files) {
  MutexLock lock(&repo_.mu_);
  ++files_.saves;
}

ModuleRepository::SaveInProgress::~SaveInProgress() {
  MutexLock lock(&repo_.mu_);
  --files_.saves;
}

absl::Status ModuleRepository::Save(
    const ModuleName& name, const Module& root, const ChangeNote& note,
    const std::vector<PrewrittenBytes>& prewritten) {
  MODELSTATE_RETURN_IF_ERROR(CheckUsable(name));
  std::shared_ptr<ModuleFiles> files = FilesOf(name);
  const std::string dir = ModuleDir(name);
  SaveInProgress saving(*this, *files);
  MODELSTATE_RETURN_IF_ERROR(EnsureModuleDir(name));
  for (const PrewrittenBytes& p : prewritten) {
    files->by_version[VersionKey(*p.storage, p.dtype)] = {p.file, p.key,
                                                          p.crc32c};
    std::error_code ec;
    files->file_bytes[p.file] = fs::file_size(FilePath(dir, p.file), ec);
  }

  TreeEncoder tree(root);
  const std::vector<TreeEncoder::StorageUse>& uses = tree.storages();
  // Which storages are on disk already, unchanged.
  std::vector<const StoredBytes*> reused(uses.size(), nullptr);
  std::set<std::string> reused_files;
  uint64_t live_bytes = 0;
  for (size_t i = 0; i < uses.size(); ++i) {
    auto it =
        files->by_version.find(VersionKey(*uses[i].storage, uses[i].dtype));
    if (it == files->by_version.end()) continue;
    reused[i] = &it->second;
    reused_files.insert(it->second.file);
    live_bytes += uses[i].storage->nbytes();
  }
  uint64_t reused_file_bytes = 0;
  for (const std::string& f : reused_files) {
    reused_file_bytes += files->file_bytes[f];
  }
  if (reused_files.size() >= kMaxDataFiles ||
      reused_file_bytes > 2 * live_bytes + kDeadBytesSlack) {
    std::fill(reused.begin(), reused.end(), nullptr);  // rewrite everything
  }

  // New bytes go to one new data file.
  std::map<std::string, uint64_t> file_bytes;
  std::vector<StoredBytes> where(uses.size());
  std::vector<SafetensorsEntry> layout;
  std::vector<size_t> to_write;
  for (size_t i = 0; i < uses.size(); ++i) {
    if (reused[i] != nullptr) {
      where[i] = *reused[i];
      file_bytes[where[i].file] = files->file_bytes[where[i].file];
      continue;
    }
    to_write.push_back(i);
    layout.push_back({absl::StrCat("s", i), uses[i].dtype, uses[i].shape});
  }
  if (!to_write.empty()) {
    std::string file;
    {
      MutexLock lock(&mu_);
      file = NextDataFile(*files);
    }
    const std::string path = FilePath(dir, file);
    MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFileWriter> writer,
                                SafetensorsFileWriter::Open(path, layout));
    for (size_t i : to_write) {
      // Mapped bytes rewritten into a new file (a compaction) get a new
      // CRC there: damage must be caught before it is sealed in.
      MODELSTATE_RETURN_IF_ERROR(uses[i].storage->CheckIntegrity());
      MODELSTATE_ASSIGN_OR_RETURN(Tensor host, HostTensor(uses[i]));
      where[i] = {file, absl::StrCat("s", i), Crc32c(BytesOf(host))};
      MODELSTATE_RETURN_IF_ERROR(writer->Append(BytesOf(host)));
    }
    MODELSTATE_RETURN_IF_ERROR(writer->Finish());
    std::error_code ec;
    file_bytes[file] = fs::file_size(path, ec);
  }

  Json storages = Json::array();
  for (size_t i = 0; i < uses.size(); ++i) {
    storages.push_back(Json{{"file", where[i].file},
                            {"key", where[i].key},
                            {"dtype", std::string(DTypeName(uses[i].dtype))},
                            {"shape", uses[i].shape},
                            {"crc32c", where[i].crc32c}});
  }
  Json body{{"format", kManifestFormat},
            {"module", name.full()},
            {"change", NoteToJson(note)},
            {"storages", std::move(storages)},
            {"tensors", std::move(tree.tensors())},
            {"modules", std::move(tree.modules())}};
  MODELSTATE_RETURN_IF_ERROR(
      WriteFileAtomically(data_dir::ManifestPath(dir), Seal(body)));
  CommittedFirstSave(dir);

  // Committed: remember what is where, and drop what nothing names.
  files->by_version.clear();
  for (size_t i = 0; i < uses.size(); ++i) {
    files->by_version[VersionKey(*uses[i].storage, uses[i].dtype)] = where[i];
  }
  files->file_bytes = std::move(file_bytes);
  DeleteUnused(dir, files.get());
  if (map_saved_bytes_) MapSavedBytes(dir, name, uses, where);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Module>> ModuleRepository::Reload(
    const ModuleName& name) {
  std::shared_ptr<ModuleFiles> files = FilesOf(name);
  // Read into a record of its own: the module's record keeps what it knew
  // until the reload succeeded.
  ModuleFiles read;
  absl::StatusOr<Loaded> loaded =
      LoadOne(name, /*fallback_to_cpu=*/false, /*verify_now=*/true, read);
  if (!loaded.ok()) {
    MarkDamaged(name, loaded.status());
    return loaded.status();
  }
  // The record object itself stays: streamed loads may hold it to reserve
  // data files meanwhile.
  files->by_version = std::move(read.by_version);
  files->file_bytes = std::move(read.file_bytes);
  DeleteUnused(ModuleDir(name), files.get());
  return std::move(loaded->root);
}

absl::Status ModuleRepository::Remove(const ModuleName& name,
                                      const ChangeNote& note) {
  const std::string dir = ModuleDir(name);
  const std::string manifest = data_dir::ManifestPath(dir);
  if (!fs::exists(manifest)) {
    ForgetCommitted(name, Deletion::kNone);
    return absl::OkStatus();
  }
  // The tombstone names the manifest it deletes by checksum, so that a
  // later manifest of a module built again under the name is not mistaken
  // for the deleted one.
  MODELSTATE_ASSIGN_OR_RETURN(std::string text, ReadFile(manifest));
  Json tombstone{{"change", NoteToJson(note)},
                 {"manifest_sha256", Sha256Hex(text)}};
  MODELSTATE_RETURN_IF_ERROR(
      WriteFileAtomically(data_dir::TombstonePath(dir), Seal(tombstone)));
  if (unlink(manifest.c_str()) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, manifest, "unlink failed");
  }
  MODELSTATE_RETURN_IF_ERROR(FsyncParentDirectory(manifest));
  // A move mark goes with the manifest (a moved module is removed here):
  // left, it would keep the directory from going once it is empty.
  std::error_code ignored;
  fs::remove(data_dir::MoveMarkPath(dir), ignored);
  // What was committed goes; what is being written stays (ForgetCommitted).
  ForgetCommitted(name, Deletion::kQueued);
  return absl::OkStatus();
}

absl::Status ModuleRepository::MarkMove(const ModuleName& name,
                                        absl::string_view direction,
                                        absl::string_view peer) {
  const std::string dir = ModuleDir(name);
  if (!fs::exists(data_dir::ManifestPath(dir))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "module '", name.full(), "' has no committed files to move"));
  }
  return WriteFileAtomically(data_dir::MoveMarkPath(dir),
                             MoveMarkText(direction, peer));
}

absl::Status ModuleRepository::SettleMove(const ModuleName& name) {
  const std::string mark = data_dir::MoveMarkPath(ModuleDir(name));
  if (unlink(mark.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, mark, "unlink failed");
  }
  // Lost to a crash, the unlink is done again at the next start, once the
  // cluster names this replica the owner again.
  return FsyncParentDirectory(mark);
}

bool ModuleRepository::InMove(const ModuleName& name) const {
  std::error_code ignored;
  return fs::exists(data_dir::MoveMarkPath(ModuleDir(name)), ignored);
}

absl::Status ModuleRepository::SetAside(const ModuleName& name,
                                        const std::string& destination) {
  {
    MutexLock lock(&mu_);
    auto it = files_.find(name.full());
    if (it != files_.end() &&
        (!it->second->reserved.empty() || it->second->saves != 0)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "module '", name.full(), "' is being written; not set aside"));
    }
  }
  const std::string dir = ModuleDir(name);
  absl::Status moved = [&]() -> absl::Status {
    const fs::path parent = fs::path(destination).parent_path();
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat(parent.string(), ": cannot create: ", ec.message()));
    }
    if (rename(dir.c_str(), destination.c_str()) != 0) {
      return ErrnoStatus(errno, dir, "rename failed");
    }
    // Both directory entries changed: durable before anyone relies on it.
    MODELSTATE_RETURN_IF_ERROR(FsyncParentDirectory(destination));
    return FsyncParentDirectory(dir);
  }();
  MutexLock lock(&mu_);
  if (moved.ok()) {
    files_.erase(name.full());
  } else {
    // Left where it is, the copy must not be written over by a build of
    // the name, nor served: kept for an operator, as damaged files are.
    damaged_[name.full()] = absl::FailedPreconditionError(
        absl::StrCat("a copy this replica does not own could not be set "
                     "aside: ",
                     moved.message()));
  }
  return moved;
}

absl::StatusOr<std::vector<std::string>> ModuleRepository::CommittedFiles(
    const ModuleName& name) {
  const std::string dir = ModuleDir(name);
  const std::string manifest = data_dir::ManifestPath(dir);
  MODELSTATE_ASSIGN_OR_RETURN(Json body, Unseal(manifest));
  std::vector<std::string> paths;
  std::set<std::string> seen;
  try {
    for (const Json& storage : body.at("storages")) {
      const std::string file = storage.at("file").get<std::string>();
      if (seen.insert(file).second) paths.push_back(FilePath(dir, file));
    }
  } catch (const std::exception& e) {
    return Corrupt(manifest, absl::StrCat("malformed manifest: ", e.what()));
  }
  paths.push_back(manifest);
  return paths;
}

absl::StatusOr<ModuleRepository::Loaded> ModuleRepository::Import(
    const ModuleName& name, absl::string_view manifest,
    const std::map<std::string, std::string>& received, const ChangeNote& note,
    absl::string_view from_replica) {
  const std::string dir = ModuleDir(name);
  const std::string path = data_dir::ManifestPath(dir);
  // Whatever happens, the received files are no longer reserved: the
  // manifest names them now, or nothing does and they go.
  auto end_reservations = [&] {
    for (const auto& [sent, here] : received) ReleaseDataFile(name, here);
  };
  auto fail = [&](absl::Status why) {
    std::error_code ec;
    fs::remove(path, ec);
    fs::remove(data_dir::MoveMarkPath(dir), ec);
    end_reservations();
    // A build of the name held by its hooks keeps the file it reserved.
    ForgetCommitted(name, Deletion::kNow);
    fs::remove(dir, ec);  // only if empty
    return why;
  };
  absl::Status usable = CheckUsable(name);
  if (!usable.ok()) {
    end_reservations();
    return usable;
  }
  if (fs::exists(path)) {
    end_reservations();
    return absl::AlreadyExistsError(absl::StrCat(
        "module '", name.full(), "' already has a manifest at ", path));
  }
  absl::StatusOr<Json> body = UnsealText(manifest, "the sent manifest");
  if (!body.ok()) {
    return fail(absl::InvalidArgumentError(body.status().message()));
  }
  try {
    if (body->at("module").get<std::string>() != name.full()) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("manifest: describes module ",
                       Quote(body->at("module").get<std::string>()), ", not '",
                       name.full(), "'")));
    }
    for (Json& storage : body->at("storages")) {
      const std::string sent = storage.at("file").get<std::string>();
      auto it = received.find(sent);
      if (it == received.end()) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("manifest: names data file ", Quote(sent),
                         ", which was not sent")));
      }
      storage["file"] = fs::path(it->second).filename().string();
    }
    (*body)["change"] = NoteToJson(note);
  } catch (const std::exception& e) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("manifest: malformed: ", e.what())));
  }
  // A module without tensors comes as its manifest alone: nothing sent
  // made its directory.
  std::shared_ptr<ModuleFiles> files = FilesOf(name);
  SaveInProgress saving(*this, *files);
  if (absl::Status ensured = EnsureModuleDir(name); !ensured.ok()) {
    return fail(ensured);
  }
  // Marked before the manifest commits: a crash before the cluster names
  // this replica the owner leaves a copy that a restart hosts only if the
  // takeover happened.
  const std::string mark = data_dir::MoveMarkPath(dir);
  absl::Status marked =
      WriteFileAtomically(mark, MoveMarkText("in", from_replica));
  if (!marked.ok()) return fail(marked);
  absl::Status written = WriteFileAtomically(path, Seal(*body));
  if (!written.ok()) return fail(written);
  CommittedFirstSave(dir);
  absl::StatusOr<Loaded> loaded =
      LoadOne(name, /*fallback_to_cpu=*/false, /*verify_now=*/true, *files);
  if (!loaded.ok()) return fail(loaded.status());
  end_reservations();
  DeleteUnused(dir, files.get());
  return loaded;
}

void ModuleRepository::DropTombstone(const ModuleName& name) {
  // Queued behind the module's data files: until they are gone, the
  // tombstone tells LoadAll that they belong to a deletion.
  MutexLock lock(&mu_);
  deletions_.push_back(data_dir::TombstonePath(ModuleDir(name)));
  deletions_changed_.SignalAll();
}

absl::StatusOr<ModuleRepository::Loaded> ModuleRepository::LoadOne(
    const ModuleName& name, bool fallback_to_cpu, bool verify_now,
    ModuleFiles& files) {
  const std::string dir = ModuleDir(name);
  const std::string path = data_dir::ManifestPath(dir);
  MODELSTATE_ASSIGN_OR_RETURN(Json body, Unseal(path));
  TreeDecoder decoder(dir, path, name.full(), fallback_to_cpu, verify_now);
  Loaded loaded;
  loaded.name = name;
  try {
    if (body.at("format").get<int>() != kManifestFormat) {
      return Corrupt(path, absl::StrCat("unknown manifest format ",
                                        body.at("format").dump()));
    }
    if (body.at("module").get<std::string>() != name.full()) {
      return Corrupt(path, absl::StrCat("describes module '",
                                        body.at("module").get<std::string>(),
                                        "', not '", name.full(), "'"));
    }
    loaded.note = NoteFromJson(body.at("change"));
    MODELSTATE_ASSIGN_OR_RETURN(loaded.root, decoder.Decode(body));
  } catch (const std::exception& e) {
    return Corrupt(path, absl::StrCat("malformed manifest: ", e.what()));
  }
  loaded.bytes = decoder.bytes();
  for (const TreeDecoder::Stored& stored : decoder.stored()) {
    files.by_version[stored.version_key] = {stored.file, stored.key,
                                            stored.crc32c};
    if (files.file_bytes.count(stored.file) == 0) {
      std::error_code ec;
      files.file_bytes[stored.file] =
          fs::file_size(FilePath(dir, stored.file), ec);
    }
  }
  return loaded;
}

ModuleRepository::LoadReport ModuleRepository::LoadAll(bool fallback_to_cpu) {
  LoadReport report;
  std::error_code ec;
  std::vector<ModuleName> names;
  for (const auto& ns : fs::directory_iterator(dir_, ec)) {
    if (!ns.is_directory()) continue;
    for (const auto& module : fs::directory_iterator(ns.path(), ec)) {
      if (!module.is_directory()) continue;
      ModuleName name{ns.path().filename().string(),
                      module.path().filename().string()};
      if (!IsValidModuleNamePart(name.ns) ||
          !IsValidModuleNamePart(name.name)) {
        report.errors.push_back(absl::DataLossError(
            absl::StrCat(module.path().string(),
                         ": not a module directory (bad name); ignored")));
        continue;
      }
      names.push_back(std::move(name));
    }
  }
  std::sort(names.begin(), names.end());
  for (const ModuleName& name : names) {
    const std::string dir = ModuleDir(name);
    const std::string manifest = data_dir::ManifestPath(dir);
    const std::string tombstone = data_dir::TombstonePath(dir);
    bool deleted = false;  // the manifest is one a removal committed to delete
    if (fs::exists(tombstone)) {
      absl::StatusOr<Json> t = Unseal(tombstone);
      if (!t.ok()) {
        report.errors.push_back(t.status());
        MarkDamaged(name, t.status());
        continue;
      }
      try {
        report.removed.push_back({name, NoteFromJson(t->at("change"))});
        absl::StatusOr<std::string> text = ReadFile(manifest);
        deleted = text.ok() && Sha256Hex(*text) ==
                                   t->at("manifest_sha256").get<std::string>();
      } catch (const std::exception& e) {
        report.errors.push_back(Corrupt(tombstone, e.what()));
        MarkDamaged(name, report.errors.back());
        continue;
      }
    }
    if (deleted) fs::remove(manifest, ec);
    const std::string mark = data_dir::UncommittedPath(dir);
    if (!fs::exists(manifest)) {
      if (!fs::exists(tombstone) && !fs::exists(mark) && HasDataFiles(dir)) {
        // Neither a deletion nor a first save that crashed: the manifest
        // went missing, and the data files may be all that is left.
        report.errors.push_back(absl::DataLossError(absl::StrCat(
            data_dir::ManifestPath(dir),
            ": missing, beside data files that no deletion or unfinished "
            "first save explains; the module is not loaded and its files "
            "are kept for repair")));
        MarkDamaged(name, report.errors.back());
        continue;
      }
      // Never committed, or removed: nothing here is needed.
      DeleteUnused(dir, nullptr, /*now=*/true);
      fs::remove(mark, ec);
      fs::remove(data_dir::MoveMarkPath(dir), ec);
      fs::remove(dir, ec);  // only if empty (no tombstone left)
      continue;
    }
    fs::remove(mark, ec);  // the first save committed
    auto files = std::make_shared<ModuleFiles>();
    absl::StatusOr<Loaded> loaded =
        LoadOne(name, fallback_to_cpu, /*verify_now=*/false, *files);
    if (!loaded.ok()) {
      report.errors.push_back(loaded.status());
      MarkDamaged(name, loaded.status());
      continue;
    }
    files->next_file = FreeDataFileNumber(dir);
    DeleteUnused(dir, files.get(), /*now=*/true);
    report.modules.push_back(*std::move(loaded));
    MutexLock lock(&mu_);
    files_[name.full()] = files;
  }
  return report;
}

}  // namespace modelstate

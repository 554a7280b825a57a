// File: module.h
// `Module`: PyTorch's torch.nn.Module state model. A module has a type name,
// insertion-ordered parameters, buffers (persistent or not) and submodules,
// plain attributes (a layer's constructor arguments), and a training flag.
// Registration validates names with PyTorch's exact error texts and runs the
// global registration hooks (hooks.h); traversal, state_dict, load_state_dict
// and to() follow PyTorch (shared/PYTORCH-SPEC.md) except where
// shared/SEMANTICS.md decides otherwise.
//
// Example:
//   std::shared_ptr<Module> m = Module::Create("MyModel");
//   MODELSTATE_ASSIGN_OR_RETURN(Tensor w, Tensor::Zeros(DType::kFloat32, {3}));
//   MODELSTATE_ASSIGN_OR_RETURN(Tensor p, MakeParameter(w));
//   MODELSTATE_ASSIGN_OR_RETURN(RegistrationOutcome o,
//                               m->RegisterParameter("w", p));
//   StateDict sd = m->StateDict();           // {"w": ...}
//   MODELSTATE_RETURN_IF_ERROR(m->To(std::nullopt, DType::kFloat16));
#ifndef MODELSTATE_CORE_MODULE_H_
#define MODELSTATE_CORE_MODULE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/forward_hooks.h"
#include "core/hooks.h"
#include "core/ordered_dict.h"
#include "core/registration.h"
#include "core/tensor.h"

namespace modelstate {

class Module;

// A plain (non-registered) attribute value: None, bool, int, float, str,
// a list of ints or floats, or a plain tensor (PyTorch 3.4f: a tensor
// assigned to a new name is an attribute, not a buffer).
using AttrValue =
    std::variant<std::monostate, bool, int64_t, double, std::string,
                 std::vector<int64_t>, std::vector<double>, Tensor>;

// Python's type name of an attribute value, for error texts ("int", "str",
// "torch.FloatTensor", "NoneType", ...).
std::string AttrTypeName(const AttrValue& value);

// What `Module::SetAttr` assigns: None, a tensor (a parameter if created by
// MakeParameter), a module, or a plain value.
using AttrAssignment =
    std::variant<std::nullptr_t, Tensor, std::shared_ptr<Module>, AttrValue>;

// What `Module::GetAttr` finds.
using AttrLookup = std::variant<Tensor, std::shared_ptr<Module>, AttrValue>;

// A state_dict: ordered keys to tensors, plus PyTorch's `_metadata` (module
// path -> class version) when produced by Module::StateDict. A hand-made
// state_dict has no metadata, like a plain Python dict.
struct StateDict {
  OrderedDict<Tensor> tensors;
  std::optional<OrderedDict<int>> metadata;
};

// PyTorch's _IncompatibleKeys.
struct IncompatibleKeys {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;

  // "<All keys matched successfully>" or
  // "_IncompatibleKeys(missing_keys=['a'], unexpected_keys=[])".
  std::string ToString() const;
};

// The result of one registration call.
struct RegistrationOutcome {
  HookDecision decision;  // keep / replace / block, and the stored value
};

// What was in a slot before a registration, so that a later decision (for
// example a remote subscriber's) can restore it.
struct SlotState {
  bool existed = false;     // The name was in the kind's map (maybe as None).
  SlotValue value;          // The value (null for None).
  ptrdiff_t position = -1;  // Its place in that map when it existed.
};

// One registration as it happened, in order: the event before any hook ran,
// the in-process hooks' decision, and the slot's prior state. Builds and
// assign-mode loads produce these so that remote decisions can be applied
// afterwards (ApplyFinalDecisions).
struct RegistrationRecord {
  std::shared_ptr<Module> owner;  // The module registered into.
  RegistrationEvent event;        // event.value: the value before any hook.
  bool removal = false;           // An explicit removal (not a None store).
  HookDecision local;             // The in-process hooks' decision.
  SlotState before;               // The slot before this registration.
  bool applied = true;            // Whether `local` was stored (not dry run).
};

// Where registrations report to. Default: the global in-process hooks, no
// record kept, path "".
struct RegistrationContext {
  const HookRegistry* hooks = &HookRegistry::Global();  // nullptr: no hooks
  std::vector<RegistrationRecord>* records = nullptr;   // appended to if set
  std::string path;  // Path of the module being registered into.
  // Validate and run the hooks, record, but store nothing: the caller
  // applies the (possibly remote) final decisions with ApplyFinalDecisions.
  // REQUIRES: records != nullptr.
  bool dry_run = false;
};

// Where a load's bytes come from when the state_dict does not hold them
// (LoadOptions::source). The state_dict's tensors then only describe the
// entries: meta tensors with each entry's dtype and shape. The load asks
// for each entry's bytes as it writes them, so a state_dict staged on disk
// is never held in memory twice.
class LoadSource {
 public:
  virtual ~LoadSource() = default;
  // Writes the first target.numel() elements of entry `key`, converted to
  // target's dtype, into `target`, whose bytes are its own to overwrite.
  virtual absl::Status CopyInto(const std::string& key, Tensor& target) = 0;
  // Entry `key` as a CPU tensor (extra state; assign mode).
  virtual absl::StatusOr<Tensor> Read(const std::string& key) = 0;
};

struct LoadOptions {
  // Missing or unexpected keys are errors (they are always reported).
  bool strict = true;
  // Validate everything first and change nothing unless the whole load
  // succeeds (SEMANTICS L1). false: PyTorch's partial behaviour.
  bool atomic = true;
  // Install the checkpoint's tensors instead of copying into the module's
  // (PyTorch 2.1's assign=True); fires registration hooks.
  bool assign = false;
  // Not owned. When set, the bytes come from here (see LoadSource).
  LoadSource* source = nullptr;
};

struct LoadResult {
  IncompatibleKeys keys;
  // assign=true only: one outcome per installed entry, in load order.
  std::vector<std::pair<std::string, RegistrationOutcome>> registrations;
};

// A module. Thread-compatible: concurrent const use is safe; any mutation
// needs exclusive access to the whole tree (the server holds a per-tree
// lock). Module hooks (HookRegistry) are thread-safe on their own.
class Module : public std::enable_shared_from_this<Module> {
 public:
  // A generic module: a custom module or a container. `type_name` is the
  // class name ("TinyModel"); `qualified_name` is what torch.typename()
  // prints ("torch.nn.modules.container.Sequential"); defaults to
  // "__main__.<type_name>".
  static std::shared_ptr<Module> Create(std::string type_name,
                                        std::string qualified_name = "");

  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  virtual ~Module() = default;

  const std::string& type_name() const { return type_name_; }
  const std::string& qualified_name() const { return qualified_name_; }
  // The state_dict metadata version (1; BatchNorm 2).
  int version() const { return version_; }
  void set_version(int version) { version_ = version; }
  // Built-in layers keep their tensors' shapes (SEMANTICS H4).
  bool fixed_shapes() const { return fixed_shapes_; }
  void set_fixed_shapes(bool fixed) { fixed_shapes_ = fixed; }
  bool is_training() const { return training_; }
  // This module's flag only (Train() sets the whole subtree); for restoring
  // a saved tree where children may differ from their parent.
  void set_training(bool training) { training_ = training; }

  // ----------------------------------------------------------------------
  // Registration. Each validates the name (PyTorch's texts), runs the hooks
  // of its kind (also for None, SEMANTICS H3), and stores the decided value
  // unless a hook blocked. Validation errors: INVALID_ARGUMENT, or
  // ALREADY_EXISTS for "attribute 'x' already exists". A block is not an
  // error: see the outcome.

  // PyTorch's register_parameter. `param` must be undefined (None) or a
  // parameter (MakeParameter).
  absl::StatusOr<RegistrationOutcome> RegisterParameter(
      std::string name, Tensor param, const RegistrationContext& ctx = {});
  // PyTorch's register_buffer (a parameter is accepted and stored as is).
  absl::StatusOr<RegistrationOutcome> RegisterBuffer(
      std::string name, Tensor tensor, bool persistent = true,
      const RegistrationContext& ctx = {});
  // PyTorch's add_module / register_module. INVALID_ARGUMENT if `child`
  // would make the tree cyclic.
  absl::StatusOr<RegistrationOutcome> RegisterModule(
      std::string name, std::shared_ptr<Module> child,
      const RegistrationContext& ctx = {});
  // Explicit removal of a parameter, buffer or submodule: fires that kind's
  // hooks with an unregister event; unless blocked the name disappears.
  // NOT_FOUND with PyTorch's AttributeError text if no such entry.
  absl::StatusOr<RegistrationOutcome> RemoveEntry(
      absl::string_view name, const RegistrationContext& ctx = {});

  // PyTorch's attribute protocol (PYTORCH-SPEC 3.4, 3.6, 3.7), except that a
  // name used by another kind is never silently moved (SEMANTICS N1).
  absl::StatusOr<RegistrationOutcome> SetAttr(
      std::string name, AttrAssignment value,
      const RegistrationContext& ctx = {});
  absl::StatusOr<AttrLookup> GetAttr(absl::string_view name) const;
  absl::StatusOr<RegistrationOutcome> DelAttr(
      absl::string_view name, const RegistrationContext& ctx = {});

  // Plain attributes (constructor arguments of built-in layers).
  void SetPlainAttribute(std::string name, AttrValue value);
  const OrderedDict<AttrValue>& attributes() const { return attributes_; }

  // Names that already exist on the module's class (methods and fixed
  // attributes such as "forward" or "training"), per PyTorch's hasattr.
  void AddClassAttributes(absl::Span<const absl::string_view> names);
  bool HasClassAttribute(absl::string_view name) const;
  // All of them, sorted.
  std::vector<std::string> ClassAttributeNames() const;
  // Only those beyond every module's (the class's own methods and fields),
  // sorted: what a saved module needs to carry.
  std::vector<std::string> OwnClassAttributeNames() const;

  // ----------------------------------------------------------------------
  // Direct access. Entries may hold undefined tensors / null modules (None).
  const OrderedDict<Tensor>& parameters() const { return parameters_; }
  const OrderedDict<Tensor>& buffers() const { return buffers_; }
  const OrderedDict<std::shared_ptr<Module>>& children() const {
    return children_;
  }
  bool IsPersistentBuffer(absl::string_view name) const {
    return !non_persistent_.contains(name);
  }
  // The module at dotted `path` below this one ("" = this module).
  // NOT_FOUND naming the missing component.
  absl::StatusOr<std::shared_ptr<Module>> GetSubmodule(
      absl::string_view path) const;

  // ----------------------------------------------------------------------
  // Traversal (PYTORCH-SPEC 5).
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> NamedModules(
      absl::string_view prefix = "", bool remove_duplicate = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> NamedChildren()
      const;
  std::vector<std::pair<std::string, Tensor>> NamedParameters(
      absl::string_view prefix = "", bool recurse = true,
      bool remove_duplicate = true) const;
  std::vector<std::pair<std::string, Tensor>> NamedBuffers(
      absl::string_view prefix = "", bool recurse = true,
      bool remove_duplicate = true) const;

  // ----------------------------------------------------------------------
  // State (PYTORCH-SPEC 6, 7).

  // Tensors are detached views sharing storage unless `keep_vars`.
  StateDict GetStateDict(absl::string_view prefix = "",
                         bool keep_vars = false) const;

  // PyTorch's load_state_dict, atomic by default (SEMANTICS L1). On failure
  // returns FAILED_PRECONDITION whose message is PyTorch's RuntimeError text
  // ("Error(s) in loading state_dict for Linear:\n\t...").
  absl::StatusOr<LoadResult> LoadStateDict(const StateDict& state_dict,
                                           const LoadOptions& options = {},
                                           const RegistrationContext& ctx = {});

  // Extra state (PyTorch's get_extra_state / set_extra_state): modules that
  // opt in hold an opaque byte tensor saved under "_extra_state".
  void EnableExtraState(Tensor initial);
  bool has_extra_state() const { return has_extra_state_; }
  const Tensor& extra_state() const { return extra_state_; }

  // BatchNorm's rule for state_dicts older than version 2 without
  // num_batches_tracked: keep the current value (PyTorch >= 2.2).
  void set_fills_num_batches_tracked(bool value) {
    fills_num_batches_tracked_ = value;
  }
  bool fills_num_batches_tracked() const { return fills_num_batches_tracked_; }

  // ----------------------------------------------------------------------
  // Conversion (PYTORCH-SPEC 8, 9). Atomic: on error nothing changed.

  // PyTorch's to(device, dtype): floating tensors change dtype, every tensor
  // moves; parameters keep identity and requires_grad. INVALID_ARGUMENT with
  // PyTorch's text for a non-floating dtype; FAILED_PRECONDITION for a device
  // that is not available.
  absl::Status To(std::optional<Device> device, std::optional<DType> dtype);
  absl::Status Half() { return To(std::nullopt, DType::kFloat16); }
  absl::Status Float() { return To(std::nullopt, DType::kFloat32); }
  absl::Status Double() { return To(std::nullopt, DType::kFloat64); }
  absl::Status BFloat16() { return To(std::nullopt, DType::kBFloat16); }
  // PyTorch's type(dtype): converts every tensor, integer and bool ones
  // included (a buffer tied into several modules becomes one per module,
  // as in PyTorch; a tied parameter stays tied), and moves each to `device`
  // if given. INVALID_ARGUMENT with PyTorch's text for a non-floating dtype
  // while a parameter requires grad; FAILED_PRECONDITION for a device that
  // is not available.
  absl::Status Type(DType dtype, std::optional<Device> device = std::nullopt);
  // Sets requires_grad on every parameter (deduplicated). INVALID_ARGUMENT
  // (and nothing changed) if `value` is true and a parameter is not floating.
  absl::Status RequiresGrad(bool value = true);
  void Train(bool mode = true);
  void Eval() { Train(false); }

  // Total bytes of distinct tensors (parameters and buffers) in the tree.
  uint64_t TotalBytes() const;

  // ----------------------------------------------------------------------
  // Forward hooks (forward_hooks.h), run by Forward() (forward.h) around
  // this module's calls: PyTorch's register_forward_pre_hook and
  // register_forward_hook. Thread-safe.
  RemovableHandle RegisterForwardPreHook(ForwardPreHook hook,
                                         bool prepend = false) {
    return forward_hooks_.AddPreHook(std::move(hook), prepend);
  }
  RemovableHandle RegisterForwardHook(ForwardHook hook, bool prepend = false) {
    return forward_hooks_.AddHook(std::move(hook), prepend);
  }
  const ForwardHookList& forward_hooks() const { return forward_hooks_; }

 protected:
  Module(std::string type_name, std::string qualified_name);

 private:
  // Gives module.cc's free helpers (conversion plans, deferred decisions)
  // access to the slot primitives below.
  friend struct ModuleInternals;

  // The shared registration path: validation done, runs hooks, stores.
  absl::StatusOr<RegistrationOutcome> Register(EntryKind kind, std::string name,
                                               SlotValue value, bool removal,
                                               const RegistrationContext& ctx);
  // Stores `value` in the slot (`present` false: erase the name). A name
  // not in the map is appended, or inserted at `position` if >= 0.
  void StoreSlot(EntryKind kind, const std::string& name, bool present,
                 const SlotValue& value, ptrdiff_t position = -1);
  SlotState ReadSlot(EntryKind kind, absl::string_view name) const;
  // ALREADY_EXISTS if `name` is taken by something other than `kind`.
  absl::Status CheckNameFree(EntryKind kind, absl::string_view name) const;
  // Whether `target` is this module or one below it.
  bool ContainsModule(const Module* target) const;

  // Constant after construction.
  const std::string type_name_;
  const std::string qualified_name_;

  int version_ = 1;
  bool fixed_shapes_ = false;
  bool training_ = true;
  bool has_extra_state_ = false;
  bool fills_num_batches_tracked_ = false;
  Tensor extra_state_;
  OrderedDict<Tensor> parameters_;
  OrderedDict<Tensor> buffers_;
  absl::flat_hash_set<std::string> non_persistent_;
  OrderedDict<std::shared_ptr<Module>> children_;
  OrderedDict<AttrValue> attributes_;
  // Beyond those of every module (kModuleClassAttributes, shared).
  absl::flat_hash_set<std::string> class_attributes_;
  // Not module state: never saved, copied or hooked.
  ForwardHookList forward_hooks_;
};

// Checks that `replacement` may stand in for `event`'s value (SEMANTICS H4):
// only register events; same kind of value (tensor vs module), defined; the
// dtype stays floating point if it was (and unchanged otherwise); the shape
// is kept in built-in layers; the device exists; requires_grad only on
// floating dtypes; a module may not contain the module it is registered in.
// Returns INVALID_ARGUMENT saying what is wrong.
absl::Status ValidateReplacement(const RegistrationEvent& event,
                                 const SlotValue& replacement);

// Turns a tensor replacement for a parameter into a parameter (see
// HookResult::Replace); other values are returned as they are.
absl::StatusOr<SlotValue> NormalizeReplacement(const RegistrationEvent& event,
                                               SlotValue replacement);

// NormalizeReplacement, then ValidateReplacement: what a hook's replacement
// is stored as (HookRegistry::Run's check).
absl::StatusOr<SlotValue> CheckReplacement(const RegistrationEvent& event,
                                           SlotValue replacement);

// Applies the final decisions for `records` (one per record, in order) to the
// modules they touched, as if each registration had been decided that way
// when it happened: every slot ends with the value of its last
// non-blocked registration, or its state before the first one.
// INVALID_ARGUMENT if the spans differ in length.
absl::Status ApplyFinalDecisions(absl::Span<const RegistrationRecord> records,
                                 absl::Span<const HookDecision> finals);

// Checks every byte `module`'s tree holds that was mapped from a file
// (Storage::CheckIntegrity), for a call about to read them all (a forward,
// a to(), hashes): DATA_LOSS naming the first damaged tensor by its key.
absl::Status CheckHeldBytes(const Module& module);

// How many entries PyTorch's path-by-path traversals of `module` walk
// (state_dict, its _metadata, load_state_dict): every submodule path below
// it, plus the non-null parameters and buffers at every path. A shared
// submodule counts once per path, so a chain of submodules each shared
// twice (a "diamond") doubles it per level: a tiny tree can have 2^40
// state_dict keys. Computed in time linear in the distinct modules;
// saturates at UINT64_MAX.
uint64_t TraversalEntries(const Module& module);

// The number of paths from `root` down to `target` (1 for the root itself,
// 0 when it is not in the tree); saturates at UINT64_MAX.
uint64_t PathsTo(const Module& root, const Module& target);

}  // namespace modelstate

#endif  // MODELSTATE_CORE_MODULE_H_

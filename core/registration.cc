#include "core/registration.h"

#include <utility>

namespace modelstate {

absl::string_view EntryKindName(EntryKind kind) {
  switch (kind) {
    case EntryKind::kParameter:
      return "parameter";
    case EntryKind::kBuffer:
      return "buffer";
    case EntryKind::kModule:
      return "module";
  }
  return "unknown";
}

absl::string_view RegistrationActionName(RegistrationAction action) {
  return action == RegistrationAction::kRegister ? "register" : "unregister";
}

HookResult HookResult::Replace(Tensor tensor) {
  HookResult r(Kind::kReplace);
  r.replacement_.tensor = std::move(tensor);
  return r;
}

HookResult HookResult::ReplaceBuffer(Tensor tensor, bool persistent) {
  HookResult r(Kind::kReplace);
  r.replacement_.tensor = std::move(tensor);
  r.replacement_.persistent = persistent;
  r.has_persistent_ = true;
  return r;
}

HookResult HookResult::Replace(std::shared_ptr<Module> module) {
  HookResult r(Kind::kReplace);
  r.replacement_.module = std::move(module);
  return r;
}

HookResult HookResult::Block(std::string reason) {
  HookResult r(Kind::kBlock);
  r.reason_ = std::move(reason);
  return r;
}

}  // namespace modelstate

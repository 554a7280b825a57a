#include "core/forward_hooks.h"

#include <utility>

namespace modelstate {
namespace {

template <typename Hook>
std::vector<Hook> Copy(const HookList<Hook>& list) {
  const auto entries = list.Snapshot();
  std::vector<Hook> hooks;
  hooks.reserve(entries->size());
  for (const auto& entry : *entries) hooks.push_back(*entry.hook);
  return hooks;
}

}  // namespace

ForwardHookList& ForwardHookList::Global() {
  static auto* global = new ForwardHookList();
  return *global;
}

RemovableHandle ForwardHookList::AddPreHook(ForwardPreHook hook, bool prepend) {
  return pre_.Add(std::move(hook), prepend);
}

RemovableHandle ForwardHookList::AddHook(ForwardHook hook, bool prepend) {
  return post_.Add(std::move(hook), prepend);
}

std::vector<ForwardPreHook> ForwardHookList::PreHooks() const {
  return Copy(pre_);
}

std::vector<ForwardHook> ForwardHookList::Hooks() const { return Copy(post_); }

bool ForwardHookList::HasPreHooks() const { return !pre_.empty(); }
bool ForwardHookList::HasHooks() const { return !post_.empty(); }

}  // namespace modelstate

#include "core/forward_hooks.h"

#include <atomic>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace modelstate {
namespace {

// Ids are unique across every list, so a handle can never remove another
// list's hook by accident.
std::atomic<uint64_t> next_forward_hook_id{1};

template <typename Hook>
void Insert(std::vector<std::pair<uint64_t, Hook>>& list, uint64_t id,
            Hook hook, bool prepend) {
  if (prepend) {
    list.insert(list.begin(), {id, std::move(hook)});
  } else {
    list.emplace_back(id, std::move(hook));
  }
}

template <typename Hook>
void Erase(std::vector<std::pair<uint64_t, Hook>>& list, uint64_t id) {
  for (auto it = list.begin(); it != list.end(); ++it) {
    if (it->first == id) {
      list.erase(it);
      return;
    }
  }
}

}  // namespace

struct ForwardHookHandle::State {
  mutable absl::Mutex mu;
  std::vector<std::pair<uint64_t, ForwardPreHook>> pre ABSL_GUARDED_BY(mu);
  std::vector<std::pair<uint64_t, ForwardHook>> post ABSL_GUARDED_BY(mu);
  // Read without the lock on every module call; written under it.
  std::atomic<size_t> num_pre{0};
  std::atomic<size_t> num_post{0};
};

void ForwardHookHandle::Remove() {
  std::shared_ptr<State> state = state_.lock();
  state_.reset();
  if (state == nullptr) return;
  absl::MutexLock lock(&state->mu);
  Erase(state->pre, id_);
  Erase(state->post, id_);
  state->num_pre = state->pre.size();
  state->num_post = state->post.size();
}

ForwardHookList::ForwardHookList()
    : state_(std::make_shared<ForwardHookHandle::State>()) {}

ForwardHookList::~ForwardHookList() = default;

ForwardHookList& ForwardHookList::Global() {
  static auto* global = new ForwardHookList();
  return *global;
}

ForwardHookHandle ForwardHookList::AddPreHook(ForwardPreHook hook,
                                              bool prepend) {
  uint64_t id = next_forward_hook_id++;
  absl::MutexLock lock(&state_->mu);
  Insert(state_->pre, id, std::move(hook), prepend);
  state_->num_pre = state_->pre.size();
  return ForwardHookHandle(state_, id);
}

ForwardHookHandle ForwardHookList::AddHook(ForwardHook hook, bool prepend) {
  uint64_t id = next_forward_hook_id++;
  absl::MutexLock lock(&state_->mu);
  Insert(state_->post, id, std::move(hook), prepend);
  state_->num_post = state_->post.size();
  return ForwardHookHandle(state_, id);
}

std::vector<ForwardPreHook> ForwardHookList::PreHooks() const {
  absl::MutexLock lock(&state_->mu);
  std::vector<ForwardPreHook> hooks;
  hooks.reserve(state_->pre.size());
  for (const auto& [id, hook] : state_->pre) hooks.push_back(hook);
  return hooks;
}

std::vector<ForwardHook> ForwardHookList::Hooks() const {
  absl::MutexLock lock(&state_->mu);
  std::vector<ForwardHook> hooks;
  hooks.reserve(state_->post.size());
  for (const auto& [id, hook] : state_->post) hooks.push_back(hook);
  return hooks;
}

bool ForwardHookList::HasPreHooks() const { return state_->num_pre > 0; }
bool ForwardHookList::HasHooks() const { return state_->num_post > 0; }

}  // namespace modelstate

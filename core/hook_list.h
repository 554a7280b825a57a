// File: hook_list.h
// An ordered, thread-safe list of hooks of one signature, and the handle
// that removes one of them: the one mechanism under both hook frameworks,
// the registration hooks (hooks.h) and the forward hooks (forward_hooks.h).
//
// Hooks may be added and removed while other threads run them: a run takes
// a snapshot of the list (an immutable vector swapped under the lock) and
// calls the hooks present then, so removing a hook, even from inside a hook,
// takes effect for the next run. Ids come from one process-wide counter, as
// PyTorch's RemovableHandle ids do, so a handle never removes another list's
// hook by accident.
//
// Example:
//   HookList<std::function<void(int)>> list;
//   RemovableHandle h = list.Add([](int x) { ... });
//   auto hooks = list.Snapshot();  // keep it alive while the hooks run
//   for (const auto& entry : *hooks) (*entry.hook)(42);
//   h.Remove();
#ifndef MODELSTATE_CORE_HOOK_LIST_H_
#define MODELSTATE_CORE_HOOK_LIST_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "base/sync.h"

namespace modelstate {

namespace internal {

// What a RemovableHandle removes its hook from.
class HookOwner {
 public:
  virtual ~HookOwner() = default;
  virtual void Remove(uint64_t id) = 0;
};

// The next hook id (never 0).
uint64_t NextHookId();

}  // namespace internal

// Removes one hook. Removing twice, or after the list is gone, is a no-op.
// Thread-safe. Movable, not copyable; destroying it does NOT remove the hook
// (as in PyTorch, where a dropped handle leaves the hook in place).
class RemovableHandle {
 public:
  RemovableHandle() = default;
  RemovableHandle(std::weak_ptr<internal::HookOwner> owner, uint64_t id)
      : owner_(std::move(owner)), id_(id) {}
  RemovableHandle(RemovableHandle&&) = default;
  RemovableHandle& operator=(RemovableHandle&&) = default;

  void Remove() {
    std::shared_ptr<internal::HookOwner> owner = owner_.lock();
    owner_.reset();
    if (owner != nullptr) owner->Remove(id_);
  }
  // The hook's id, unique in the process (0 for an empty handle).
  uint64_t id() const { return id_; }

 private:
  std::weak_ptr<internal::HookOwner> owner_;
  uint64_t id_ = 0;
};

// Thread-safe.
template <typename Hook>
class HookList {
 public:
  struct Entry {
    uint64_t id;
    std::shared_ptr<const Hook> hook;
  };
  using Entries = std::vector<Entry>;

  HookList() : state_(std::make_shared<State>()) {}
  HookList(const HookList&) = delete;
  HookList& operator=(const HookList&) = delete;

  // Appends `hook`, or puts it first with `prepend`.
  RemovableHandle Add(Hook hook, bool prepend = false) {
    Entry entry{internal::NextHookId(),
                std::make_shared<const Hook>(std::move(hook))};
    const uint64_t id = entry.id;
    MutexLock lock(&state_->mu);
    auto copy = std::make_shared<Entries>(*state_->entries);
    copy->insert(prepend ? copy->begin() : copy->end(), std::move(entry));
    state_->Swap(std::move(copy));
    return RemovableHandle(state_, id);
  }

  // The hooks now, in run order. Hold the pointer while iterating: a range-for
  // over `*Snapshot()` would iterate a destroyed list.
  std::shared_ptr<const Entries> Snapshot() const {
    MutexLock lock(&state_->mu);
    return state_->entries;
  }
  // Without taking the lock: lets a hot path skip the snapshot.
  size_t size() const { return state_->count.load(); }
  bool empty() const { return size() == 0; }

 private:
  struct State : internal::HookOwner {
    Mutex mu;
    std::shared_ptr<const Entries> entries ABSL_GUARDED_BY(mu) =
        std::make_shared<Entries>();
    std::atomic<size_t> count{0};

    void Swap(std::shared_ptr<const Entries> next)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      count = next->size();
      entries = std::move(next);
    }
    void Remove(uint64_t id) override {
      MutexLock lock(&mu);
      for (size_t i = 0; i < entries->size(); ++i) {
        if ((*entries)[i].id != id) continue;
        auto copy = std::make_shared<Entries>(*entries);
        copy->erase(copy->begin() + static_cast<ptrdiff_t>(i));
        Swap(std::move(copy));
        return;
      }
    }
  };
  std::shared_ptr<State> state_;
};

}  // namespace modelstate

#endif  // MODELSTATE_CORE_HOOK_LIST_H_

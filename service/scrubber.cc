#include "service/scrubber.h"

#include <utility>

namespace modelstate {

Scrubber::Scrubber(const ModelStore* store, absl::Duration interval,
                   OnPass on_pass)
    : store_(store), interval_(interval), on_pass_(std::move(on_pass)) {
  thread_ = std::thread([this] { Run(); });
}

Scrubber::~Scrubber() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  stop_changed_.SignalAll();
  thread_.join();
}

bool Scrubber::stopping() const {
  MutexLock lock(&mu_);
  return stop_;
}

void Scrubber::Run() {
  while (true) {
    {
      MutexLock lock(&mu_);
      const absl::Time next = absl::Now() + interval_;
      while (!stop_ && !stop_changed_.WaitWithDeadline(&mu_, next)) {
      }
      if (stop_) return;
    }
    ModelStore::ScrubReport report =
        store_->Scrub([this] { return stopping(); });
    if (stopping()) return;
    on_pass_(report);
  }
}

}  // namespace modelstate

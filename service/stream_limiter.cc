#include "service/stream_limiter.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"

namespace modelstate {

StreamLimiter::Slot::~Slot() {
  MutexLock lock(&owner_->mu_);
  if (--owner_->open_[identity_] == 0) owner_->open_.erase(identity_);
}

absl::StatusOr<std::unique_ptr<StreamLimiter::Slot>> StreamLimiter::Acquire(
    const std::string& identity) {
  MutexLock lock(&mu_);
  int& open = open_[identity];
  if (max_per_identity_ > 0 && open >= max_per_identity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "max_streams_per_identity (", max_per_identity_, ") reached: '",
        identity, "' already has ", open, " streams open"));
  }
  ++open;
  return std::make_unique<Slot>(this, identity);
}

}  // namespace modelstate

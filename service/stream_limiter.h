// File: stream_limiter.h
// Counts each identity's open streams (state_dict transfers, audit watches,
// subscriptions) against a limit, so that one caller cannot hold every
// server thread or connection slot.
//
// Example:
//   StreamLimiter streams(16);
//   MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<StreamLimiter::Slot> slot,
//                               streams.Acquire("alice"));
//   ... stream; the slot is given back when `slot` is destroyed.
#ifndef MODELSTATE_SERVICE_STREAM_LIMITER_H_
#define MODELSTATE_SERVICE_STREAM_LIMITER_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/sync.h"

namespace modelstate {

// Thread-safe.
class StreamLimiter {
 public:
  // max_per_identity <= 0: no limit.
  explicit StreamLimiter(int max_per_identity)
      : max_per_identity_(max_per_identity) {}

  // Holds one stream slot until destroyed. Must not outlive its limiter.
  class Slot {
   public:
    Slot(StreamLimiter* owner, std::string identity)
        : owner_(owner), identity_(std::move(identity)) {}
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot();

   private:
    StreamLimiter* owner_;
    std::string identity_;
  };

  // RESOURCE_EXHAUSTED naming max_streams_per_identity when `identity`
  // already has that many streams open.
  absl::StatusOr<std::unique_ptr<Slot>> Acquire(const std::string& identity);

 private:
  const int max_per_identity_;
  Mutex mu_;
  std::map<std::string, int> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_STREAM_LIMITER_H_

// File: limits.h
// Every limit the service enforces, with its default, in one place. The
// server's flags take their defaults from here, and the lower layers' own
// small limit structs (nn's BuildLimits, core's StreamLimits) are filled
// from a Limits by one function each.
//
// Example:
//   Limits limits;
//   limits.max_tensor_bytes = uint64_t{1} << 30;
//   BuildOptions options;
//   options.limits = BuildLimitsFrom(limits);
#ifndef MODELSTATE_SERVICE_LIMITS_H_
#define MODELSTATE_SERVICE_LIMITS_H_

#include <cstddef>
#include <cstdint>

#include "absl/time/time.h"
#include "core/state_stream.h"
#include "nn/module_spec.h"

namespace modelstate {

struct Limits {
  // The largest gRPC message accepted or sent. An event with tensor data
  // travels in one message, so it also caps a subscription's
  // max_data_bytes (less 1 MiB for the rest of the event).
  uint64_t max_message_bytes = uint64_t{64} << 20;
  // GetStateDict's bytes per data message when the request leaves
  // chunk_bytes 0, and the most a request may ask for.
  uint32_t default_chunk_bytes = uint32_t{1} << 20;
  uint32_t max_chunk_bytes = uint32_t{16} << 20;
  // The largest single tensor accepted or built.
  uint64_t max_tensor_bytes = uint64_t{16} << 30;
  // The largest module built, and the largest state_dict loaded.
  uint64_t max_module_bytes = uint64_t{64} << 30;
  // The deepest module nesting of a spec.
  int max_spec_depth = 64;
  // The most parameters, buffers and submodules in one module (or entries
  // in one loaded state_dict).
  int64_t max_entries = 1'000'000;
  // Events waiting to be written to one subscriber before it is dropped.
  size_t max_queued_events = 10000;
  // Bytes of events (tensor data included) waiting to be written to one
  // subscriber before it is dropped. Queued events share the tensors' bytes
  // with the modules; only the one being written is copied. Also the most
  // tensor data a dry-run subscriber's unanswered events keep alive.
  uint64_t max_subscriber_queue_bytes = uint64_t{256} << 20;
  // Streams (state_dict transfers, audit watches, subscriptions) one
  // authenticated identity may have open at once; 0: unlimited. Without
  // authentication streams are not counted (every caller is the same
  // anonymous admin).
  int max_streams_per_identity = 16;
  // Builds that may wait at once for another build of the same name (each
  // holds a server thread while that one's hooks decide); further ones are
  // RESOURCE_EXHAUSTED at once. 0: unlimited.
  int max_build_waiters = 16;
  // A subscriber's timeout per event when its subscription leaves
  // timeout_ms 0.
  absl::Duration subscriber_timeout = absl::Seconds(10);
  // Refused calls (PERMISSION_DENIED, UNAUTHENTICATED) are audited per
  // (peer address, identity or "unauthenticated", rpc, module, error) and
  // interval: the first of each in an interval gets its own record, the
  // rest one "denied" record with their count at the interval's end (and
  // at shutdown). 0: every refusal gets its own record. Subscribers' stray
  // answers (late, duplicate, unknown event ids) are counted over the same
  // interval, per subscriber name (SubscriberHub).
  absl::Duration denied_audit_interval = absl::Seconds(60);
  // The most such keys counted in one interval; the refusals of further
  // keys are counted together in one "other" record. So one interval
  // writes at most 2 * max_denied_keys + 2 denied records.
  size_t max_denied_keys = 256;
};

// The limits of a build (BuildModule, a submodule spec, an init tensor).
BuildLimits BuildLimitsFrom(const Limits& limits);
// The limits of a streamed state_dict (LoadStateDict).
StreamLimits StreamLimitsFrom(const Limits& limits);

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_LIMITS_H_

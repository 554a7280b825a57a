#include "service/denial_recorder.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace modelstate {
namespace {

// One key's text: each part with its length, so that no two keys collide
// whatever bytes their parts hold.
std::string DenialKey(const audit_events::DeniedCount& d) {
  std::string key;
  for (absl::string_view part :
       {absl::string_view(d.peer), absl::string_view(d.identity),
        absl::string_view(d.rpc), absl::string_view(d.module.ns),
        absl::string_view(d.module.name), d.status.message()}) {
    absl::StrAppend(&key, part.size(), ":", part, ";");
  }
  absl::StrAppend(&key, static_cast<int>(d.status.code()));
  return key;
}

}  // namespace

std::string PeerAddress(absl::string_view peer) {
  const size_t colon = peer.rfind(':');
  const size_t scheme = peer.find(':');
  // "unix:/path" and the like have no port; an IPv6 address's own colons
  // sit inside its brackets.
  if (colon == absl::string_view::npos || colon == scheme) {
    return std::string(peer);
  }
  const size_t bracket = peer.rfind(']');
  if (bracket != absl::string_view::npos && bracket > colon) {
    return std::string(peer);
  }
  return std::string(peer.substr(0, colon));
}

namespace {

// The summary of refusals of keys beyond the `max_keys` counted apart.
AuditAggregator::Summarise OverflowSummary(size_t max_keys) {
  return [max_keys](const AuditTally& tally) {
    audit_events::DeniedCount other;
    other.peer = "*";
    other.rpc = "*";
    other.status = absl::ResourceExhaustedError(absl::StrCat(
        "refusals of more keys (peer, identity, rpc, module, error) than "
        "the ",
        max_keys, " counted apart in one interval"));
    other.count = tally.count;
    other.first = tally.first;
    other.last = tally.last;
    return audit_events::DeniedAggregate(other);
  };
}

}  // namespace

DenialRecorder::DenialRecorder(AuditLog* audit, absl::Duration interval,
                               size_t max_keys)
    : counts_(audit, interval, max_keys, /*individual=*/1,
              OverflowSummary(max_keys)) {}

DenialRecorder::~DenialRecorder() { Stop(); }

void DenialRecorder::Record(const OperationContext& ctx, absl::string_view peer,
                            absl::string_view rpc, const ModuleName& module,
                            const absl::Status& status) {
  audit_events::DeniedCount d;
  d.identity = ctx.identity;
  d.peer = PeerAddress(peer);
  d.rpc = std::string(rpc);
  d.module = module;
  d.status = status;
  const std::string key = DenialKey(d);
  counts_.Record(
      {.key = key, .kind = "", .id = 0},
      [&] { return audit_events::Denied(ctx, peer, rpc, module, status); },
      [&]() -> AuditAggregator::Summarise {
        return [d](const AuditTally& tally) {
          audit_events::DeniedCount counted = d;
          counted.count = tally.count;
          counted.first = tally.first;
          counted.last = tally.last;
          return audit_events::DeniedAggregate(counted);
        };
      });
}

void DenialRecorder::RecordRevocation(const OperationContext& ctx,
                                      absl::string_view peer,
                                      absl::string_view rpc,
                                      const ModuleName& module,
                                      const absl::Status& status) {
  counts_.RecordOwn(
      [&] { return audit_events::Denied(ctx, peer, rpc, module, status); });
}

void DenialRecorder::Flush() { counts_.Flush(); }

void DenialRecorder::Stop() { counts_.Stop(); }

}  // namespace modelstate

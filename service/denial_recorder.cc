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

DenialRecorder::DenialRecorder(AuditLog* audit, absl::Duration interval,
                               size_t max_keys)
    : audit_(audit), interval_(interval), max_keys_(max_keys) {
  if (audit_ != nullptr && interval_ > absl::ZeroDuration()) {
    thread_ = std::thread([this] { Run(); });
  }
}

DenialRecorder::~DenialRecorder() { Stop(); }

void DenialRecorder::Record(const OperationContext& ctx, absl::string_view peer,
                            absl::string_view rpc, const ModuleName& module,
                            const absl::Status& status) {
  if (audit_ == nullptr) return;
  bool counted = false;
  if (interval_ > absl::ZeroDuration()) {
    audit_events::DeniedCount d;
    d.identity = ctx.identity;
    d.peer = PeerAddress(peer);
    d.rpc = std::string(rpc);
    d.module = module;
    d.status = status;
    const std::string key = DenialKey(d);
    MutexLock lock(&mu_);
    counted = CountLocked(key, d, absl::Now());
  }
  // A refusal that cannot be recorded is still a refusal; the log's own
  // failure shows up on the next change it must record.
  if (!counted) {
    (void)audit_->Append(audit_events::Denied(ctx, peer, rpc, module, status));
  }
}

bool DenialRecorder::CountLocked(const std::string& key,
                                 const audit_events::DeniedCount& d,
                                 absl::Time now) {
  auto it = counts_.find(key);
  if (it == counts_.end()) {
    const bool has_other = counts_.contains("");
    if (counts_.size() - (has_other ? 1 : 0) < max_keys_) {
      counts_.emplace(key, d);
      return false;
    }
    if (!has_other) {
      audit_events::DeniedCount other;
      other.peer = "*";
      other.rpc = "*";
      other.status = absl::ResourceExhaustedError(absl::StrCat(
          "refusals of more keys (peer, identity, rpc, module, error) than "
          "the ",
          max_keys_, " counted apart in one interval"));
      counts_.emplace("", std::move(other));
      return false;
    }
    it = counts_.find("");
  }
  audit_events::DeniedCount& c = it->second;
  if (c.count == 0) c.first = now;
  ++c.count;
  c.last = now;
  return true;
}

void DenialRecorder::Flush() {
  std::map<std::string, audit_events::DeniedCount> counts;
  {
    MutexLock lock(&mu_);
    counts.swap(counts_);
  }
  if (audit_ == nullptr) return;
  for (const auto& [key, d] : counts) {
    if (d.count > 0) (void)audit_->Append(audit_events::DeniedAggregate(d));
  }
}

void DenialRecorder::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  Flush();
}

void DenialRecorder::Run() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      const absl::Time deadline = absl::Now() + interval_;
      while (!stopping_ && !wake_.WaitWithDeadline(&mu_, deadline)) {
      }
      if (stopping_) return;
    }
    Flush();
  }
}

}  // namespace modelstate

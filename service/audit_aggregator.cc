#include "service/audit_aggregator.h"

#include <utility>

#include "absl/time/clock.h"

namespace modelstate {

AuditAggregator::AuditAggregator(AuditLog* audit, absl::Duration interval,
                                 size_t max_keys, size_t individual,
                                 Summarise overflow)
    : audit_(audit),
      interval_(interval),
      max_keys_(max_keys),
      individual_(individual < 1 ? 1 : individual),
      overflow_(std::move(overflow)) {
  if (audit_ != nullptr && interval_ > absl::ZeroDuration()) {
    thread_ = std::thread([this] { Run(); });
  }
}

AuditAggregator::~AuditAggregator() { Stop(); }

bool AuditAggregator::Record(const Occurrence& occurrence,
                             absl::FunctionRef<AuditRecord()> individual,
                             absl::FunctionRef<Summarise()> summarise) {
  if (audit_ == nullptr) return true;
  if (interval_ > absl::ZeroDuration()) {
    const absl::Time now = absl::Now();
    MutexLock lock(&mu_);
    Entry* entry;
    auto it = entries_.find(occurrence.key);
    if (it != entries_.end()) {
      entry = &it->second;
    } else if (entries_.size() < max_keys_) {
      entry =
          &entries_.emplace(std::string(occurrence.key), Entry{}).first->second;
      entry->summarise = summarise();
    } else {
      entry = &other_;
    }
    if (entry->recorded >= individual_) {
      AuditTally& t = entry->tally;
      if (t.count == 0) {
        t.first = now;
        t.first_id = occurrence.id;
      }
      ++t.count;
      t.last = now;
      t.last_id = occurrence.id;
      if (!occurrence.kind.empty()) {
        std::string kind(occurrence.kind.substr(0, AuditTally::kMaxKindBytes));
        if (t.kinds.size() >= AuditTally::kMaxKinds &&
            !t.kinds.contains(kind)) {
          kind = "other";
        }
        ++t.kinds[kind];
      }
      return false;
    }
    ++entry->recorded;
  }
  // An occurrence that cannot be recorded still happened; the log's own
  // failure shows up on the next change it must record.
  (void)audit_->Append(individual());
  return true;
}

void AuditAggregator::RecordOwn(absl::FunctionRef<AuditRecord()> individual) {
  if (audit_ != nullptr) (void)audit_->Append(individual());
}

void AuditAggregator::WriteAndReset(Entry& entry) {
  if (entry.tally.count == 0) return;
  AuditTally tally = std::move(entry.tally);
  entry.tally = AuditTally();
  const Summarise& summarise =
      entry.summarise != nullptr ? entry.summarise : overflow_;
  if (audit_ != nullptr && summarise != nullptr) {
    (void)audit_->Append(summarise(tally));
  }
}

void AuditAggregator::FlushKey(absl::string_view key) {
  MutexLock flushing(&flush_mu_);
  Entry taken;
  {
    MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.tally.count == 0) return;
    taken.tally = std::move(it->second.tally);
    it->second.tally = AuditTally();
    taken.summarise = it->second.summarise;
  }
  WriteAndReset(taken);
}

void AuditAggregator::Flush() {
  MutexLock flushing(&flush_mu_);
  std::map<std::string, Entry, std::less<>> entries;
  Entry other;
  {
    MutexLock lock(&mu_);
    entries.swap(entries_);
    std::swap(other, other_);
  }
  for (auto& [key, entry] : entries) WriteAndReset(entry);
  WriteAndReset(other);
}

void AuditAggregator::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  Flush();
}

void AuditAggregator::Run() {
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

// File: audit_aggregator.h
// Keeps occurrences that each would write an audit record (refused calls,
// a subscriber's stray answers) from growing the log, which keeps every
// record for good, by one record per occurrence, while still recording
// every one of them.
//
// Occurrences are counted per key (who did it) and interval. The first
// `individual` of a key in an interval get their own record at once, so a
// single one shows at once with its details (request id, event id). The
// rest of that interval's are folded into the key's tally (count, first
// and last time, first and last id, count by kind) and written as one
// summary record when the interval ends, when the key is flushed (the
// subscriber left), and at Stop. At most `max_keys` keys are counted in one
// interval; occurrences of further keys share one overflow key. So an
// interval writes at most (individual + 1) * (max_keys + 1) records, and
// the table holds at most max_keys + 1 keys.
//
// Example:
//   AuditAggregator stray(audit_log, absl::Seconds(60), 256, 8, overflow);
//   stray.Record({.key = name, .kind = "late", .id = event_id},
//                [&] { return audit_events::Answer(facts); },
//                [&] { return SummaryOf(name); });
//   ...
//   stray.FlushKey(name);  // the subscriber left: its tally is written
//   stray.Stop();          // the last tallies are written
#ifndef MODELSTATE_SERVICE_AUDIT_AGGREGATOR_H_
#define MODELSTATE_SERVICE_AUDIT_AGGREGATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/sync.h"
#include "service/audit_log.h"

namespace modelstate {

// The occurrences of one key folded into its summary.
struct AuditTally {
  // Distinct kinds counted apart; further kinds are counted as "other".
  static constexpr size_t kMaxKinds = 16;
  // A kind's text is kept up to this many bytes.
  static constexpr size_t kMaxKindBytes = 256;

  uint64_t count = 0;
  absl::Time first;
  absl::Time last;
  // Ids of the first and last (0 when the occurrences have none).
  uint64_t first_id = 0;
  uint64_t last_id = 0;
  std::map<std::string, uint64_t> kinds;  // empty when they have no kind
};

// Thread-safe.
class AuditAggregator {
 public:
  // Builds the record of a key's tally (count > 0) when it is written.
  using Summarise = std::function<AuditRecord(const AuditTally&)>;

  struct Occurrence {
    absl::string_view key;
    absl::string_view kind;  // "": none
    uint64_t id = 0;         // 0: none
  };

  // `audit` (not owned, must outlive this) null: nothing is recorded.
  // `interval` 0: every occurrence gets its own record (nothing is
  // counted, no thread). `individual` (at least 1): the occurrences of a
  // key recorded one by one in an interval before the rest are counted.
  // `overflow` summarises the occurrences of keys beyond `max_keys`.
  AuditAggregator(AuditLog* audit, absl::Duration interval, size_t max_keys,
                  size_t individual, Summarise overflow);
  // Stops (see Stop).
  ~AuditAggregator();
  AuditAggregator(const AuditAggregator&) = delete;
  AuditAggregator& operator=(const AuditAggregator&) = delete;

  // One occurrence: `individual` is called (and its record appended) when
  // it gets its own record; otherwise it is counted, and `summarise`, called
  // only for the first occurrence of a key in an interval, builds the key's
  // summary when it is written. Returns whether it got its own record.
  bool Record(const Occurrence& occurrence,
              absl::FunctionRef<AuditRecord()> individual,
              absl::FunctionRef<Summarise()> summarise);
  // An occurrence that gets its own record whatever its key's count, for
  // callers whose occurrences are bounded on their own (a reload revokes
  // each transfer under way once) and must be found at once.
  void RecordOwn(absl::FunctionRef<AuditRecord()> individual);
  // Writes `key`'s tally now (its owner is gone, for now). The key keeps
  // what it used of the interval's individual records, so coming back
  // does not buy more.
  void FlushKey(absl::string_view key);
  // Writes every tally now and starts a new interval.
  void Flush();
  // Ends the interval thread and flushes (idempotent). Occurrences
  // recorded later are still counted, and written by Flush or the
  // destructor.
  void Stop();

 private:
  struct Entry {
    size_t recorded = 0;  // own records this interval
    AuditTally tally;
    Summarise summarise;
  };

  void Run();
  // Appends `entry`'s summary when it has counted anything, and resets it.
  void WriteAndReset(Entry& entry);

  AuditLog* const audit_;
  const absl::Duration interval_;
  const size_t max_keys_;
  const size_t individual_;
  const Summarise overflow_;
  // Flushes run one at a time, so that a summary is written once, and
  // in the order the tallies were taken.
  Mutex flush_mu_;
  Mutex mu_;
  CondVar wake_;
  // This interval's keys, sorted so that a flush writes in a stable order.
  std::map<std::string, Entry, std::less<>> entries_ ABSL_GUARDED_BY(mu_);
  // The keys beyond max_keys_.
  Entry other_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_AUDIT_AGGREGATOR_H_

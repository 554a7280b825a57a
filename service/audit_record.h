// File: audit_record.h
// One audit record and a query over records: the values AuditLog stores
// (service/audit_log.h) and AuditIndex finds (service/audit_index.h).
//
// Example:
//   AuditQuery query;
//   query.ns = "team";
//   query.module = "mlp";
//   query.after_seq = 120;  // the page after record 120
//   for (const AuditRecord& r : *log->Query(query)) Print(r.seq, r.type);
#ifndef MODELSTATE_SERVICE_AUDIT_RECORD_H_
#define MODELSTATE_SERVICE_AUDIT_RECORD_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"

namespace modelstate {

// One record. `seq`, `time`, `prev` and `hash` are filled in by Append.
struct AuditRecord {
  uint64_t seq = 0;
  absl::Time time;
  std::string identity;
  std::string correlation_id;
  // What happened: "build", "registration", "answer", "outcome",
  // "load_state_dict", "move", "delete", "set_training", "subscribe",
  // "unsubscribe", "denied", ... (lowercase). The service's records are
  // built by service/audit_events.h, which lists every type; the log
  // itself takes any text.
  std::string type;
  std::string ns;      // namespace of the module concerned, if any
  std::string module;  // module name (without namespace), if any
  // "keep" / "replace" / "block" for registration outcomes and answers,
  // "ok" / "error" for other changes; may be empty.
  std::string outcome;
  // Everything else, as a JSON object text ("{}" when empty). Must be a
  // valid JSON object; Append rejects anything else.
  std::string details_json = "{}";
  std::string prev;
  std::string hash;
  // The call that wrote it (OperationContext::call_id), for AuditLog's
  // per-call collection (BeginCall). Not part of the record: never stored,
  // hashed or parsed back (0 in records read from the log).
  uint64_t call_id = 0;
};

// Which records a query returns (all conditions must hold; empty/unset
// means no condition).
struct AuditQuery {
  std::optional<absl::Time> since;  // time >= since
  std::optional<absl::Time> until;  // time < until
  std::string ns;
  std::string module;
  std::string identity;
  std::string outcome;
  std::string type;
  std::string correlation_id;  // the request that wrote the records
  // Records per query when a query asks for 0, and the most it may ask for.
  static constexpr size_t kDefaultLimit = 100;
  static constexpr size_t kMaxLimit = 10000;

  uint64_t after_seq = 0;  // seq > after_seq (paging)
  size_t limit = kDefaultLimit;

  // Whether `record` meets every condition but after_seq and limit (which
  // page, rather than filter).
  bool Matches(const AuditRecord& record) const;
  // `limit` with 0 read as kDefaultLimit and capped at kMaxLimit.
  size_t EffectiveLimit() const;
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_AUDIT_RECORD_H_

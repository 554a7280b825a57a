// File: audit_index.h
// An index of the audit log in SQLite (WAL mode): for each record, where its
// line lies in the log file and the fields queries filter on (time,
// identity, type, namespace, module, outcome). It is derived data: the log's
// bytes stay canonical, and AuditLog rebuilds the index from them whenever
// it cannot trust it. What it buys is a start-up and a query that do not
// read the whole log: AuditLog keeps no record in memory.
//
// Rows are added in batches (one SQLite transaction per batch, without
// fsync: a crash may lose the last batches, which is why a stamp of the
// log file is saved only at a clean close and taken away at the next open;
// after a crash, AuditLog indexes the records after the last indexed one).
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<AuditIndex> index,
//                               AuditIndex::Open("data/audit.index"));
//   MODELSTATE_RETURN_IF_ERROR(index->Add(record, {record.seq, offset, n}));
//   MODELSTATE_ASSIGN_OR_RETURN(std::vector<AuditLocation> page,
//                               index->Find(query));
#ifndef MODELSTATE_SERVICE_AUDIT_INDEX_H_
#define MODELSTATE_SERVICE_AUDIT_INDEX_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/sync.h"
#include "service/audit_record.h"

struct sqlite3;

namespace modelstate {

// Where a record's line lies in the log file (its length without '\n').
struct AuditLocation {
  uint64_t seq = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// The log file as it was when it was last closed cleanly: if the file still
// looks exactly like this, nobody has written to it since.
struct AuditFileStamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t inode = 0;
  uint64_t last_seq = 0;

  bool operator==(const AuditFileStamp&) const = default;
};

// Thread-safe.
class AuditIndex {
 public:
  // Opens (creating if needed) the index at `path`; "" keeps it in memory.
  // An index SQLite cannot read, or one of another schema version, is
  // deleted and made anew (it is derived data); `rebuilt()` then says why.
  static absl::StatusOr<std::unique_ptr<AuditIndex>> Open(
      const std::string& path);
  ~AuditIndex();

  // Why Open had to start afresh ("" when it did not).
  const std::string& rebuilt() const { return rebuilt_; }

  // The stamp SaveCleanStamp left, removed from the index as it is read, so
  // that a crash before the next clean close cannot pass for one.
  absl::StatusOr<std::optional<AuditFileStamp>> TakeCleanStamp();
  absl::Status SaveCleanStamp(const AuditFileStamp& stamp);

  // Adds the record at `where` (records come in seq order, one after the
  // last) to the batch that any read or Flush commits. Cheap and never
  // blocked by a commit in progress, so a log may call it under its own
  // lock; true when a full batch waits, which the caller then commits with
  // Flush, outside its lock. A batch whose commit fails stays, in front of
  // the rows added since, for the next Flush: rows leave the batch only
  // into the table, so the indexed rows are always 1..LastSeq().
  [[nodiscard]] bool Add(const AuditRecord& record, const AuditLocation& where);
  absl::Status Flush();
  // Drops every row (before a rebuild from the log).
  absl::Status Clear();

  // The last seq indexed (0 when none).
  absl::StatusOr<uint64_t> LastSeq();
  // Where record `seq` lies; nullopt when it is not indexed.
  absl::StatusOr<std::optional<AuditLocation>> Locate(uint64_t seq);
  // The records matching `query` after query.after_seq, in seq order, at
  // most query.EffectiveLimit().
  absl::StatusOr<std::vector<AuditLocation>> Find(const AuditQuery& query);

 private:
  // A row waiting for its batch's transaction.
  struct Row {
    AuditLocation where;
    int64_t time_ns;
    std::string identity, type, ns, module, outcome, correlation_id;
  };
  AuditIndex(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One transaction; rolled back on any error.
  absl::Status WriteRows(const std::vector<Row>& rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  std::string rebuilt_;
  // Taken before pending_mu_ when both are.
  Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
  // The batch has its own lock so that Add never waits for a commit: a
  // commit takes the batch away and writes it under mu_ alone.
  Mutex pending_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<Row> pending_ ABSL_GUARDED_BY(pending_mu_);
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_AUDIT_INDEX_H_

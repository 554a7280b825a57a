#include "service/audit_index.h"

#include <sqlite3.h>
#include <unistd.h>

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status_macros.h"

namespace modelstate {
namespace {

// Bumped whenever the tables change; an index of another version is
// rebuilt from the log rather than migrated (it is derived data).
constexpr int kSchemaVersion = 1;
// Rows per transaction when appends arrive faster than anything reads.
constexpr size_t kBatchRows = 4096;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS records(
  seq INTEGER PRIMARY KEY,
  offset INTEGER NOT NULL,
  length INTEGER NOT NULL,
  time_ns INTEGER NOT NULL,
  identity TEXT NOT NULL,
  type TEXT NOT NULL,
  ns TEXT NOT NULL,
  module TEXT NOT NULL,
  outcome TEXT NOT NULL,
  correlation_id TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS records_by_request ON records(correlation_id, seq);
CREATE INDEX IF NOT EXISTS records_by_module ON records(ns, module, seq);
CREATE INDEX IF NOT EXISTS records_by_identity ON records(identity, seq);
CREATE INDEX IF NOT EXISTS records_by_type ON records(type, seq);
CREATE INDEX IF NOT EXISTS records_by_outcome ON records(outcome, seq);
CREATE INDEX IF NOT EXISTS records_by_time ON records(time_ns);
CREATE TABLE IF NOT EXISTS clean_close(
  id INTEGER PRIMARY KEY CHECK (id = 1),
  size INTEGER NOT NULL,
  mtime_ns INTEGER NOT NULL,
  inode INTEGER NOT NULL,
  last_seq INTEGER NOT NULL);
)sql";

// A prepared statement, finalized when it goes out of scope.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& sql) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), static_cast<int>(sql.size()),
                             &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() const { return stmt_; }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void Bind(int i, const std::string& v) {
    sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()),
                      SQLITE_STATIC);
  }
  int64_t Column(int i) const { return sqlite3_column_int64(stmt_, i); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

absl::Status SqliteError(sqlite3* db, const std::string& path,
                         absl::string_view what) {
  return absl::InternalError(absl::StrCat("audit index ", path, ": cannot ",
                                          what, ": ", sqlite3_errmsg(db)));
}

// Opens the database at `path` ("" in memory), sets WAL mode and creates
// the tables; an error names what failed.
absl::StatusOr<sqlite3*> OpenDatabase(const std::string& path) {
  sqlite3* db = nullptr;
  const std::string name = path.empty() ? ":memory:" : path;
  const int rc = sqlite3_open_v2(
      name.c_str(), &db,
      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
      nullptr);
  if (rc != SQLITE_OK) {
    absl::Status error = absl::InternalError(
        absl::StrCat("audit index ", path, ": cannot open: ",
                     db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc)));
    sqlite3_close(db);
    return error;
  }
  sqlite3_busy_timeout(db, 5000);
  // The index is derived data: no fsync per commit. A crash is detected by
  // the missing clean-close stamp; the log's records after the last indexed
  // one are then read and added (a process crash loses no committed batch
  // in WAL mode; an index SQLite cannot read is made anew).
  const std::string setup = absl::StrCat(
      "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF; "
      // A small WAL: folded into the database every 1 MiB or
      // so, and cut back to at most 1 MiB after that.
      "PRAGMA wal_autocheckpoint=256; "
      "PRAGMA journal_size_limit=1048576;",
      kSchema);
  char* message = nullptr;
  if (sqlite3_exec(db, setup.c_str(), nullptr, nullptr, &message) !=
      SQLITE_OK) {
    absl::Status error = absl::InternalError(
        absl::StrCat("audit index ", path, ": cannot set up: ",
                     message != nullptr ? message : sqlite3_errmsg(db)));
    sqlite3_free(message);
    sqlite3_close(db);
    return error;
  }
  return db;
}

absl::StatusOr<int> SchemaVersion(sqlite3* db, const std::string& path) {
  Statement get(db, "PRAGMA user_version");
  if (!get.ok() || sqlite3_step(get.get()) != SQLITE_ROW) {
    return SqliteError(db, path, "read its schema version");
  }
  return static_cast<int>(get.Column(0));
}

void RemoveDatabaseFiles(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm"}) {
    ::unlink(absl::StrCat(path, suffix).c_str());
  }
}

// Opens the index at `path` with the current schema, or says why not.
absl::StatusOr<sqlite3*> OpenCurrent(const std::string& path,
                                     bool* created_afresh) {
  MODELSTATE_ASSIGN_OR_RETURN(sqlite3 * db, OpenDatabase(path));
  absl::StatusOr<int> version = SchemaVersion(db, path);
  Statement rows(db, "SELECT count(*) FROM records");
  const bool empty = rows.ok() && sqlite3_step(rows.get()) == SQLITE_ROW &&
                     rows.Column(0) == 0;
  if (version.ok() && *version == 0 && empty) {
    const std::string set =
        absl::StrCat("PRAGMA user_version=", kSchemaVersion);
    if (sqlite3_exec(db, set.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK) {
      *created_afresh = true;
      return db;
    }
  }
  if (version.ok() && *version == kSchemaVersion) return db;
  absl::Status error =
      version.ok() ? absl::FailedPreconditionError(absl::StrCat(
                         "schema version ", *version, ", not ", kSchemaVersion))
                   : version.status();
  sqlite3_close(db);
  return error;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AuditIndex>> AuditIndex::Open(
    const std::string& path) {
  bool created_afresh = false;
  absl::StatusOr<sqlite3*> db = OpenCurrent(path, &created_afresh);
  std::string rebuilt;
  if (!db.ok() && !path.empty()) {
    // Derived data that cannot be read is made anew from the log.
    rebuilt = absl::StrCat("the audit index ", path,
                           " was unusable and is rebuilt from the log (",
                           db.status().message(), ")");
    RemoveDatabaseFiles(path);
    db = OpenCurrent(path, &created_afresh);
  }
  MODELSTATE_RETURN_IF_ERROR(db.status());
  std::unique_ptr<AuditIndex> index(new AuditIndex(path, *db));
  index->rebuilt_ = std::move(rebuilt);
  return index;
}

AuditIndex::~AuditIndex() {
  MutexLock lock(&mu_);
  (void)FlushLocked();
  sqlite3_close(db_);
}

absl::Status AuditIndex::Error(const char* what) {
  return SqliteError(db_, path_, what);
}

absl::Status AuditIndex::Exec(const char* sql) {
  if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) != SQLITE_OK) {
    return Error(sql);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<AuditFileStamp>> AuditIndex::TakeCleanStamp() {
  MutexLock lock(&mu_);
  std::optional<AuditFileStamp> stamp;
  {
    Statement get(db_,
                  "SELECT size, mtime_ns, inode, last_seq FROM clean_close");
    if (!get.ok()) return Error("read the clean-close stamp");
    const int rc = sqlite3_step(get.get());
    if (rc == SQLITE_ROW) {
      stamp =
          AuditFileStamp{static_cast<uint64_t>(get.Column(0)), get.Column(1),
                         static_cast<uint64_t>(get.Column(2)),
                         static_cast<uint64_t>(get.Column(3))};
    } else if (rc != SQLITE_DONE) {
      return Error("read the clean-close stamp");
    }
  }
  // This one delete must reach the disk (a synchronous commit): a stamp
  // that outlived a crash would vouch for an index that missed the last
  // batches.
  MODELSTATE_RETURN_IF_ERROR(
      Exec("PRAGMA synchronous=FULL; DELETE FROM clean_close; "
           "PRAGMA synchronous=OFF"));
  return stamp;
}

absl::Status AuditIndex::SaveCleanStamp(const AuditFileStamp& stamp) {
  MutexLock lock(&mu_);
  MODELSTATE_RETURN_IF_ERROR(FlushLocked());
  // A synchronous commit: it makes every earlier batch in the WAL durable
  // with the stamp that vouches for them.
  MODELSTATE_RETURN_IF_ERROR(Exec("PRAGMA synchronous=FULL"));
  Statement put(db_,
                "INSERT OR REPLACE INTO clean_close"
                "(id, size, mtime_ns, inode, last_seq) VALUES (1, ?, ?, ?, ?)");
  if (!put.ok()) return Error("save the clean-close stamp");
  put.Bind(1, static_cast<int64_t>(stamp.size));
  put.Bind(2, stamp.mtime_ns);
  put.Bind(3, static_cast<int64_t>(stamp.inode));
  put.Bind(4, static_cast<int64_t>(stamp.last_seq));
  if (sqlite3_step(put.get()) != SQLITE_DONE) {
    return Error("save the clean-close stamp");
  }
  // Folds the WAL into the database so the next open starts small.
  return Exec("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA synchronous=OFF");
}

bool AuditIndex::Add(const AuditRecord& record, const AuditLocation& where) {
  MutexLock lock(&pending_mu_);
  pending_.push_back(Row{where, absl::ToUnixNanos(record.time), record.identity,
                         record.type, record.ns, record.module, record.outcome,
                         record.correlation_id});
  return pending_.size() >= kBatchRows;
}

absl::Status AuditIndex::Flush() {
  MutexLock lock(&mu_);
  return FlushLocked();
}

absl::Status AuditIndex::FlushLocked() {
  // Rows added from here on go to the next batch, after these (commits are
  // serialised by mu_, so rows reach the table in seq order).
  std::vector<Row> rows;
  {
    MutexLock lock(&pending_mu_);
    rows.swap(pending_);
  }
  if (rows.empty()) return absl::OkStatus();
  absl::Status written = WriteRows(rows);
  if (!written.ok()) {
    // The rows go back in front of those added since, to be tried again:
    // a later batch committed without them would leave a gap that the
    // last seq cannot show.
    MutexLock lock(&pending_mu_);
    rows.insert(rows.end(), std::make_move_iterator(pending_.begin()),
                std::make_move_iterator(pending_.end()));
    pending_ = std::move(rows);
  }
  return written;
}

absl::Status AuditIndex::WriteRows(const std::vector<Row>& rows) {
  MODELSTATE_RETURN_IF_ERROR(Exec("BEGIN"));
  absl::Status status;
  {
    Statement insert(db_,
                     "INSERT OR REPLACE INTO records(seq, offset, length, "
                     "time_ns, identity, type, ns, module, outcome, "
                     "correlation_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    if (!insert.ok()) status = Error("add records");
    for (size_t i = 0; status.ok() && i < rows.size(); ++i) {
      const Row& row = rows[i];
      sqlite3_reset(insert.get());
      insert.Bind(1, static_cast<int64_t>(row.where.seq));
      insert.Bind(2, static_cast<int64_t>(row.where.offset));
      insert.Bind(3, static_cast<int64_t>(row.where.length));
      insert.Bind(4, row.time_ns);
      insert.Bind(5, row.identity);
      insert.Bind(6, row.type);
      insert.Bind(7, row.ns);
      insert.Bind(8, row.module);
      insert.Bind(9, row.outcome);
      insert.Bind(10, row.correlation_id);
      if (sqlite3_step(insert.get()) != SQLITE_DONE) {
        status = Error("add records");
      }
    }
  }
  if (status.ok()) status = Exec("COMMIT");
  // A failed step or commit leaves the transaction open.
  if (!status.ok()) (void)Exec("ROLLBACK");
  return status;
}

absl::Status AuditIndex::Clear() {
  MutexLock lock(&mu_);
  {
    MutexLock batch(&pending_mu_);
    pending_.clear();
  }
  return Exec("DELETE FROM records");
}

absl::StatusOr<uint64_t> AuditIndex::LastSeq() {
  MutexLock lock(&mu_);
  MODELSTATE_RETURN_IF_ERROR(FlushLocked());
  Statement last(db_, "SELECT coalesce(max(seq), 0) FROM records");
  if (!last.ok() || sqlite3_step(last.get()) != SQLITE_ROW) {
    return Error("read the last seq");
  }
  return static_cast<uint64_t>(last.Column(0));
}

absl::StatusOr<std::optional<AuditLocation>> AuditIndex::Locate(uint64_t seq) {
  MutexLock lock(&mu_);
  MODELSTATE_RETURN_IF_ERROR(FlushLocked());
  Statement get(db_, "SELECT offset, length FROM records WHERE seq = ?");
  if (!get.ok()) return Error("locate a record");
  get.Bind(1, static_cast<int64_t>(seq));
  const int rc = sqlite3_step(get.get());
  if (rc == SQLITE_DONE) return std::nullopt;
  if (rc != SQLITE_ROW) return Error("locate a record");
  return AuditLocation{seq, static_cast<uint64_t>(get.Column(0)),
                       static_cast<uint64_t>(get.Column(1))};
}

absl::StatusOr<std::vector<AuditLocation>> AuditIndex::Find(
    const AuditQuery& query) {
  std::string sql = "SELECT seq, offset, length FROM records WHERE seq > ?";
  std::vector<const std::string*> texts;
  struct Field {
    const char* column;
    const std::string& value;
  };
  for (const Field& f :
       {Field{"identity", query.identity}, Field{"type", query.type},
        Field{"ns", query.ns}, Field{"module", query.module},
        Field{"outcome", query.outcome},
        Field{"correlation_id", query.correlation_id}}) {
    if (f.value.empty()) continue;
    absl::StrAppend(&sql, " AND ", f.column, " = ?");
    texts.push_back(&f.value);
  }
  if (query.since.has_value()) absl::StrAppend(&sql, " AND time_ns >= ?");
  if (query.until.has_value()) absl::StrAppend(&sql, " AND time_ns < ?");
  absl::StrAppend(&sql, " ORDER BY seq LIMIT ?");

  MutexLock lock(&mu_);
  MODELSTATE_RETURN_IF_ERROR(FlushLocked());
  Statement find(db_, sql);
  if (!find.ok()) return Error("query records");
  int i = 1;
  find.Bind(i++, static_cast<int64_t>(query.after_seq));
  for (const std::string* text : texts) find.Bind(i++, *text);
  if (query.since.has_value()) find.Bind(i++, absl::ToUnixNanos(*query.since));
  if (query.until.has_value()) find.Bind(i++, absl::ToUnixNanos(*query.until));
  find.Bind(i++, static_cast<int64_t>(query.EffectiveLimit()));
  std::vector<AuditLocation> out;
  int rc;
  while ((rc = sqlite3_step(find.get())) == SQLITE_ROW) {
    out.push_back(AuditLocation{static_cast<uint64_t>(find.Column(0)),
                                static_cast<uint64_t>(find.Column(1)),
                                static_cast<uint64_t>(find.Column(2))});
  }
  if (rc != SQLITE_DONE) return Error("query records");
  return out;
}

}  // namespace modelstate

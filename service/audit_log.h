// File: audit_log.h
// A tamper-evident, append-only audit log: one JSON record per line, each
// carrying a sequence number, the time, who did it, the request that caused
// it, what happened, and the SHA-256 of the previous record, so that editing,
// inserting or deleting any record breaks the chain at that point.
//
// Appends are buffered and made durable in groups: Append() returns the
// record's sequence number, Sync(seq) returns once every record up to `seq`
// is on disk (one fdatasync covers all records appended before it), so an
// operation can append many records and pay for one sync before it answers.
//
// Record format (keys in this order; "hash" last):
//   {"seq":12,"time":"2026-11-21T10:00:00.123456789Z","identity":"alice",
//    "correlation_id":"req-7","type":"registration","namespace":"team",
//    "module":"mlp","outcome":"block","details":{...},
//    "prev":"<hash of record 11>","hash":"<hash of this record>"}
// hash = SHA-256 over the record's JSON text without its ',"hash":...' part.
// The first record's "prev" is 64 zeros.
//
// The records, exactly as stored, are also the leaves of an RFC 6962 Merkle
// tree (service/audit_tree.h): leaf i is the line of seq i + 1 without its
// newline. Its hashes are kept in a hash file next to the log; the last
// signed checkpoint of the tree is kept in a file too, and Open refuses a
// log that it does not cover (cut off, or rewritten).
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       auto log, AuditLog::Open("data/audit.log",
//                                {.hashes_path = "data/audit.hashes",
//                                 .checkpoint_path = "data/audit.checkpoint",
//                                 .index_path = "data/audit.index"}));
//   AuditRecord r;
//   r.type = "delete";
//   r.ns = "team";
//   r.module = "mlp";
//   MODELSTATE_ASSIGN_OR_RETURN(uint64_t seq, log->Append(std::move(r)));
//   MODELSTATE_RETURN_IF_ERROR(log->Sync(seq));
#ifndef MODELSTATE_SERVICE_AUDIT_LOG_H_
#define MODELSTATE_SERVICE_AUDIT_LOG_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/checkpoint.h"
#include "base/merkle.h"
#include "base/metrics.h"
#include "base/sync.h"
#include "service/audit_index.h"
#include "service/audit_record.h"

namespace modelstate {

// The result of Verify.
struct AuditVerification {
  uint64_t records = 0;  // how many valid records precede the break
  bool ok = true;
  // The first broken record: its seq as written (0 when the line is not
  // even a record), its 1-based line number, and why.
  uint64_t broken_seq = 0;
  uint64_t broken_line = 0;
  std::string problem;
};

// Where the log keeps its tree, its index and its last checkpoint.
struct AuditLogOptions {
  // The tree's hash file; "" keeps the hashes in memory, rebuilt from the
  // records at each Open.
  std::string hashes_path;
  // The last signed checkpoint (a signed note whose text is a C2SP
  // checkpoint); "" keeps none.
  std::string checkpoint_path;
  // The SQLite index of the records (service/audit_index.h); "" keeps it in
  // memory, rebuilt from the records at each Open.
  std::string index_path;
};

// The tree's size and root at one moment.
struct AuditTreeHead {
  uint64_t size = 0;
  MerkleHash root{};
};

// Thread-safe.
class AuditLog {
 public:
  // Opens (creating if needed) the log at `path`. FAILED_PRECONDITION if
  // another AuditLog (in this or another process) has the file open: two
  // writers would fork the chain.
  //
  // When the log was closed cleanly and its file, tree and index are as it
  // left them (the index keeps a stamp of the file: size, mtime, inode),
  // Open reads only the last record, checks it against the tree, and checks
  // the tree against the last checkpoint: its time and memory do not grow
  // with the log. After a crash it reads only the records after the last
  // one that both the index and the tree hold (checked against that one's
  // leaf, the chain and the checkpoint), and adds them to both;
  // read_after_crash() says so. Otherwise (first start with an index, a
  // file touched while the server was down, an index, tree and log that
  // disagree) it reads the whole log, checks every record of the chain and
  // rebuilds the index and the tree; read_whole_log() says so and why.
  // INVALID_ARGUMENT naming the file and line if the log is not a valid chain
  // (a torn last line left by a crash is truncated away and reported through
  // `recovered_torn_tail()` instead). No record is kept in memory: Query, Get
  // and WaitForRecords read the file where the index points.
  //
  // With options.checkpoint_path, FAILED_PRECONDITION naming both tree
  // sizes (and the first differing seq, when the hash file tells) if the
  // log is shorter than the last saved checkpoint or its first records do
  // not hash to that checkpoint's root: a log that was cut or rewritten is
  // refused, never papered over. The hash file is derived data: Open
  // rebuilds or trims it to match the log (see tree_repair()).
  static absl::StatusOr<std::unique_ptr<AuditLog>> Open(
      const std::string& path, AuditLogOptions options = {});
  ~AuditLog();

  // Appends `record` (filling seq, time, prev, hash); returns its seq.
  // INVALID_ARGUMENT if details_json is not a JSON object. The details are
  // stored canonically (compact, keys sorted); a byte of a string field that
  // is not valid UTF-8 is stored as U+FFFD. Times never decrease along the
  // file, even if the clock steps back.
  absl::StatusOr<uint64_t> Append(AuditRecord record);
  // Returns once every record with seq <= `seq` is durable on disk.
  // Concurrent calls share one fdatasync. INVALID_ARGUMENT if `seq` was
  // never appended; a failed fdatasync fails this and every later Sync.
  absl::Status Sync(uint64_t seq);

  // OK, or the first failed write or fdatasync: sticky, since a change
  // whose record was lost must stop further unaudited changes (the server
  // refuses mutating requests with UNAVAILABLE while this is not OK).
  absl::Status health() const;

  // The sequence number of the last record (0 when empty).
  uint64_t last_seq() const;

  // Collects the seqs of the records appended with AuditRecord::call_id
  // `call_id` from now until EndCall(call_id), which returns them in seq
  // order: what one call wrote, told apart from concurrent calls whatever
  // correlation ids their clients chose. What is held is what the call
  // wrote. call_id 0 is never collected (EndCall returns nothing).
  void BeginCall(uint64_t call_id);
  std::vector<uint64_t> EndCall(uint64_t call_id);
  bool recovered_torn_tail() const { return recovered_torn_tail_; }
  // Why Open read the whole log ("" when the index let it read one record).
  const std::string& read_whole_log() const { return read_whole_log_; }
  // What Open read after a crash when the index and the tree let it read
  // only the records they lacked ("" when it did not).
  const std::string& read_after_crash() const { return read_after_crash_; }
  // What Open repaired in the hash file ("" when nothing), for the log.
  const std::string& tree_repair() const { return tree_repair_; }

  // The record with this seq. NOT_FOUND naming seq when there is none.
  absl::StatusOr<AuditRecord> Get(uint64_t seq) const;

  // The Merkle tree over the records. Sizes above the log's are
  // INVALID_ARGUMENT naming the field (tree_size, new_size); an unknown seq
  // is NOT_FOUND (see AuditTree).
  absl::StatusOr<MerkleHash> TreeRoot(uint64_t tree_size) const;
  absl::StatusOr<std::vector<MerkleHash>> InclusionProof(
      uint64_t seq, uint64_t tree_size) const;
  absl::StatusOr<std::vector<MerkleHash>> ConsistencyProof(
      uint64_t old_size, uint64_t new_size) const;
  // Makes every record so far and its hashes durable, and returns the tree
  // they form: what a checkpoint may then be signed over.
  absl::StatusOr<AuditTreeHead> SyncTree();

  // Replaces the saved checkpoint (a signed note) atomically and durably.
  // FAILED_PRECONDITION without options.checkpoint_path.
  absl::Status SaveCheckpoint(absl::string_view signed_note);
  // The saved checkpoint's note as Open found it ("" when none).
  const std::string& opened_checkpoint() const { return opened_checkpoint_; }

  // Where to observe how long each Append and each Sync (what a caller
  // waits for, shared fdatasync included) takes; either may be null; not
  // owned. Call before the first Append.
  void set_metrics(metrics::Histogram* append_seconds,
                   metrics::Histogram* sync_seconds) {
    append_seconds_ = append_seconds;
    sync_seconds_ = sync_seconds;
  }

  // Records matching `query`, in seq order, at most query.limit (0 means
  // 100; at most 10000).
  absl::StatusOr<std::vector<AuditRecord>> Query(const AuditQuery& query) const;
  // The seqs of the records Query would return, without reading them.
  absl::StatusOr<std::vector<uint64_t>> QuerySeqs(
      const AuditQuery& query) const;

  // Waits until a record with seq > `after_seq` exists or `deadline` passes;
  // returns the records after `after_seq` (at most `limit`, with the same
  // default and cap as Query), maybe none.
  absl::StatusOr<std::vector<AuditRecord>> WaitForRecords(uint64_t after_seq,
                                                          absl::Time deadline,
                                                          size_t limit);

  // Walks the chain of the file at `path` (it need not be open) and names
  // the first broken record, reading the file in chunks (memory does not
  // grow with the log; `leaves` does). NOT_FOUND if there is no file; an empty
  // file is a valid, empty chain. Any byte change in a stored line is detected.
  // `leaves` (may be null) receives the leaf hash of each line, the lines
  // from a broken record on included (the tree is over the lines as stored),
  // so that a comparison with a checkpoint tells a record rewritten in place
  // from records cut off.
  static absl::StatusOr<AuditVerification> Verify(
      const std::string& path, std::vector<MerkleHash>* leaves = nullptr);

  // The record's JSON line (without the trailing newline), as stored.
  static std::string Serialize(const AuditRecord& record);
  // Parses one stored line. INVALID_ARGUMENT if it is not a record.
  static absl::StatusOr<AuditRecord> Parse(const std::string& line);

 private:
  AuditLog() = default;
  // The index's answer, or an error after which the caller scans the log.
  absl::StatusOr<std::vector<AuditLocation>> FindInIndex(
      const AuditQuery& query) const;
  // Stops using the index (logged once): it is derived data, so a failed
  // index write or read must not stop the log.
  void IndexFailed(const absl::Status& why) const;
  // Append's part under the chain's lock: writes the line and adds it to
  // the tree and the index's batch (*index_batch_full when that is full).
  absl::StatusOr<uint64_t> Write(AuditRecord record, bool* index_batch_full);

  // ... implementation-defined members ...
  struct State;
  std::unique_ptr<State> state_;
  bool recovered_torn_tail_ = false;
  metrics::Histogram* append_seconds_ = nullptr;
  metrics::Histogram* sync_seconds_ = nullptr;
  std::string tree_repair_;
  std::string opened_checkpoint_;
  std::string read_whole_log_;
  std::string read_after_crash_;
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_AUDIT_LOG_H_

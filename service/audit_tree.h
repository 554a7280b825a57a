// File: audit_tree.h
// The audit log's RFC 6962 Merkle tree. Leaf i is the record with seq i + 1,
// exactly as stored: the bytes of its line without the trailing newline. The
// hashes live in a HashStore (base/merkle.h) next to the log, which is
// derived data: the log is canonical, and Open's Reconcile rebuilds or
// trims the store to match it. What the store adds is evidence: when the
// log was rewritten behind the server's back, the store still holds the old
// leaves and so names the first record that differs from a checkpoint.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<AuditTree> tree,
//                               AuditTree::Open("data/audit.hashes"));
//   MODELSTATE_ASSIGN_OR_RETURN(std::string repaired,
//                               tree->Reconcile(leaves_of_the_log));
//   MODELSTATE_RETURN_IF_ERROR(tree->Append(AuditLeafHash(line)));
//   MODELSTATE_ASSIGN_OR_RETURN(std::vector<MerkleHash> proof,
//                               tree->InclusionProof(/*seq=*/3, tree->size()));
#ifndef MODELSTATE_SERVICE_AUDIT_TREE_H_
#define MODELSTATE_SERVICE_AUDIT_TREE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/checkpoint.h"
#include "base/merkle.h"

namespace modelstate {

// The leaf hash of one stored record line (without its newline).
inline MerkleHash AuditLeafHash(absl::string_view line) {
  return HashLeaf(line);
}

// The root of the tree whose leaves have these hashes (O(n) hashing).
MerkleHash RootOfLeaves(absl::Span<const MerkleHash> leaves);

// How a log compares with a checkpoint of it.
struct CheckpointComparison {
  bool ok = true;
  // The first record that is missing or differs; 0 when the log matches,
  // or when nothing tells which record differs (no hash store from the time
  // of the checkpoint).
  uint64_t first_differing_seq = 0;
  // What is wrong, naming the log's size and the checkpoint's.
  std::string problem;
};

// Whether the first checkpoint.size of `leaves` (one per record, in seq
// order) hash to checkpoint.root. `old_tree` (may be null) is a store of the
// tree as it was; when it holds the checkpoint's tree, it locates the first
// record that differs.
CheckpointComparison CompareWithCheckpoint(absl::Span<const MerkleHash> leaves,
                                           const Checkpoint& checkpoint,
                                           const HashReader* old_tree,
                                           uint64_t old_tree_size);

// The leaves of a hash file (as AuditTree keeps it) read into memory, for
// offline checks that must not change the file. Whole leaves only.
absl::StatusOr<std::unique_ptr<MemoryHashStore>> ReadHashFile(
    const std::string& path);

// Thread-safe: one appender and many readers.
class AuditTree {
 public:
  // The tree in the hash file at `hashes_path` (created if missing), or in
  // memory when `hashes_path` is "".
  static absl::StatusOr<std::unique_ptr<AuditTree>> Open(
      const std::string& hashes_path);

  // Number of leaves (records) in the tree.
  uint64_t size() const { return store_->size(); }
  // The store, for comparing with a checkpoint before Reconcile.
  const HashReader& hashes() const { return *store_; }

  // Makes the tree's leaves exactly `leaves` (the log's): appends what is
  // missing, drops hashes of records the log does not have, and rewrites
  // the store from the first leaf whose stored hashes (its own or those of
  // the subtrees it completes) disagree with the log: every stored hash is
  // read once. Returns what it repaired ("" when nothing), for the
  // server's log.
  absl::StatusOr<std::string> Reconcile(absl::Span<const MerkleHash> leaves);

  absl::Status Append(const MerkleHash& leaf_hash);
  absl::Status Sync() { return store_->Sync(); }

  // The root of the first `tree_size` leaves. INVALID_ARGUMENT naming
  // tree_size when the tree is smaller.
  absl::StatusOr<MerkleHash> Root(uint64_t tree_size) const;
  // The inclusion proof of record `seq` in the tree of `tree_size` records.
  // INVALID_ARGUMENT naming tree_size when it is beyond the tree, NOT_FOUND
  // naming seq when there is no such record, INVALID_ARGUMENT naming seq
  // when the record is not in that tree.
  absl::StatusOr<std::vector<MerkleHash>> InclusionProof(
      uint64_t seq, uint64_t tree_size) const;
  // The consistency proof between two tree sizes. INVALID_ARGUMENT naming
  // new_size when it is beyond the tree, old_size when above new_size.
  absl::StatusOr<std::vector<MerkleHash>> ConsistencyProof(
      uint64_t old_size, uint64_t new_size) const;

 private:
  explicit AuditTree(std::unique_ptr<HashStore> store)
      : store_(std::move(store)) {}
  absl::Status CheckTreeSize(uint64_t tree_size, absl::string_view field) const;

  const std::unique_ptr<HashStore> store_;
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_AUDIT_TREE_H_
